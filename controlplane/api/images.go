package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// toImage is a catalog entry with its URL redacted (userinfo, query and
// fragment may hold a credential), as toDeployment shows a deployment's.
func toImage(im store.Image) apitype.Image {
	out := apitype.Image{Name: im.Name, DeployImage: im.Image, CreatedAt: im.CreatedAt}
	out.URL = protocol.RedactURL(out.URL)
	return out
}

func imageNotFound(name string) error {
	return httpjson.Errorf(protocol.CodeNotFound, "image %s is not in the catalog (better-compute images list)", human.ShortN(name, 80))
}

func (s *Server) addImage(w http.ResponseWriter, r *http.Request) error {
	var in apitype.ImageCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	in.Normalize()
	if err := in.Validate(); err != nil {
		return httpjson.Errorf(protocol.CodeInvalidInput, "%v", err)
	}
	// Milliseconds, as stored: the answer is what a show reads back.
	im := store.Image{Name: in.Name, Image: in.DeployImage, CreatedAt: s.now().Truncate(time.Millisecond)}
	if err := s.Store.AddImage(r.Context(), im); err != nil {
		if errors.Is(err, store.ErrExists) {
			return httpjson.Errorf(protocol.CodeAlreadyExists, "image %s is already in the catalog (better-compute images delete %s first)", in.Name, in.Name)
		}
		return err
	}
	s.log().Info("image added", "image", im.Name, "url", protocol.RedactURL(im.Image.URL), "sha256", im.Image.SHA256,
		"size", im.Image.Size, "format", im.Image.Format)
	httpjson.WriteJSON(w, http.StatusCreated, toImage(im))
	return nil
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) error {
	ims, err := s.Store.ListImages(r.Context())
	if err != nil {
		return err
	}
	out := apitype.ImageList{Images: make([]apitype.Image, 0, len(ims))}
	for _, im := range ims {
		out.Images = append(out.Images, toImage(im))
	}
	httpjson.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	im, err := s.Store.GetImage(r.Context(), name)
	if errors.Is(err, store.ErrNotFound) {
		return imageNotFound(name)
	}
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, toImage(im))
	return nil
}

// deleteImage removes a catalog entry. It is always safe: a deployment
// copied the entry's fields when it started, so one that runs goes on with
// them.
func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	im, err := s.Store.GetImage(r.Context(), name)
	if err == nil {
		err = s.Store.DeleteImage(r.Context(), name)
	}
	if errors.Is(err, store.ErrNotFound) {
		return imageNotFound(name)
	}
	if err != nil {
		return err
	}
	s.log().Info("image deleted", "image", name)
	httpjson.WriteJSON(w, http.StatusOK, toImage(im))
	return nil
}

// resolveImage turns a deploy by catalog name into the deploy of the
// entry's image; a deploy that gave the image is returned as it is.
func (s *Server) resolveImage(r *http.Request, in apitype.DeployCreate) (apitype.DeployCreate, error) {
	if in.ImageName == "" {
		return in, nil
	}
	im, err := s.Store.GetImage(r.Context(), in.ImageName)
	if errors.Is(err, store.ErrNotFound) {
		return in, imageNotFound(in.ImageName)
	}
	if err != nil {
		return in, err
	}
	return in.Resolve(im.Image), nil
}
