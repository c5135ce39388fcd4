package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/rollouts"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// rollouts is the Service behind the release and rollout routes, or a
// refusal when serve runs none.
func (s *Server) rollouts() (*rollouts.Service, error) {
	if s.Rollouts == nil {
		return nil, httpjson.Errorf(protocol.CodeUnsupported, "this control plane runs no rollouts")
	}
	return s.Rollouts, nil
}

func (s *Server) addRelease(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.rollouts()
	if err != nil {
		return err
	}
	var in apitype.ReleaseAdd
	if err := decode(r, &in); err != nil {
		return err
	}
	rel, added, err := svc.AddRelease(r.Context(), []byte(in.Manifest), in.URLBase)
	if err != nil {
		return err
	}
	out := toRelease(rel)
	out.Added = added
	status := http.StatusOK
	if added {
		status = http.StatusCreated
	}
	httpjson.WriteJSON(w, status, out)
	return nil
}

func (s *Server) listReleases(w http.ResponseWriter, r *http.Request) error {
	rels, err := s.Store.ListReleases(r.Context())
	if err != nil {
		return err
	}
	out := apitype.ReleaseList{Releases: make([]apitype.Release, 0, len(rels))}
	for _, rel := range rels {
		out.Releases = append(out.Releases, toRelease(rel))
	}
	httpjson.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createRollout(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.rollouts()
	if err != nil {
		return err
	}
	var in apitype.RolloutCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	var timeout time.Duration
	if in.WaveTimeout != "" {
		if timeout, err = time.ParseDuration(in.WaveTimeout); err != nil {
			return httpjson.Errorf(protocol.CodeInvalidInput, "wave_timeout (--wave-timeout) %q: want a duration like 30m", human.ShortN(in.WaveTimeout, 40))
		}
	}
	ro, err := svc.CreateRollout(r.Context(), rollouts.NewRollout{Version: in.Version, Role: in.Role, Pool: in.Pool, Site: in.Site,
		Waves: in.Waves, MaxUnavailable: in.MaxUnavailable, FailureThreshold: in.FailureThreshold, WaveTimeout: timeout})
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusCreated, toRollout(ro))
	return nil
}

func (s *Server) listRollouts(w http.ResponseWriter, r *http.Request) error {
	rs, err := s.Store.ListRollouts(r.Context())
	if err != nil {
		return err
	}
	out := apitype.RolloutList{Rollouts: make([]apitype.Rollout, 0, len(rs))}
	for _, ro := range rs {
		out.Rollouts = append(out.Rollouts, toRollout(ro))
	}
	httpjson.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getRollout(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	ro, err := s.Store.GetRollout(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		return httpjson.Errorf(protocol.CodeNotFound, "rollout %s does not exist", human.ShortN(id, 80))
	}
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, toRollout(ro))
	return nil
}

func (s *Server) actOnRollout(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.rollouts()
	if err != nil {
		return err
	}
	ro, err := svc.Act(r.Context(), r.PathValue("id"), r.PathValue("action"))
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, toRollout(ro))
	return nil
}

func (s *Server) upgradeNode(w http.ResponseWriter, r *http.Request) error {
	svc, err := s.rollouts()
	if err != nil {
		return err
	}
	var in apitype.NodeUpgrade
	if err := decode(r, &in); err != nil {
		return err
	}
	c, err := svc.UpgradeNode(r.Context(), r.PathValue("id"), rollouts.Upgrade{Version: in.Version, Manifest: []byte(in.Manifest),
		URL: in.URL, URLBase: in.URLBase})
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusCreated, toCommand(c))
	return nil
}
