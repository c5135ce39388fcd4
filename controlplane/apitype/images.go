package apitype

import (
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// ImageCreate is the body of POST /api/v1/images: a catalog entry, a name
// for an image's url, sha256, size, format and image_size (the fields of a
// deploy's image), so `machines deploy M --image NAME` does not repeat
// them.
type ImageCreate struct {
	Name string `json:"name"`
	protocol.DeployImage
}

// Normalize lowercases the digest, as a deploy's Normalize does.
func (in *ImageCreate) Normalize() { in.SHA256 = strings.ToLower(in.SHA256) }

// Validate checks a normalized entry as a deploy of it will be checked: the
// url (https, or http), sha256 (64 hex digits), size (the served length,
// which the ramdisk bounds and checks the stream with) and image_size (for
// a compressed format); format is required here, one of the protocol's.
// The error names the field at fault.
func (in ImageCreate) Validate() error {
	if !protocol.ValidName(in.Name) {
		return fmt.Errorf("name %q: %s", human.Short(in.Name), protocol.NameRule)
	}
	if in.Format == "" {
		return fmt.Errorf("format: required: raw, raw.gz, raw.xz, raw.zst or qcow2")
	}
	p := protocol.DeployImageParams{Image: in.DeployImage}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("%s", strings.TrimPrefix(err.Error(), "image."))
	}
	return nil
}

// Image is a catalog entry as the api shows it: its URL without userinfo,
// query or fragment (protocol.RedactURL), which may hold a credential.
type Image struct {
	Name string `json:"name"`
	protocol.DeployImage
	CreatedAt time.Time `json:"created_at"`
}

// ImageList answers GET /api/v1/images.
type ImageList struct {
	Images []Image `json:"images"`
}
