package api

import (
	"errors"
	"net/http"
	"slices"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// attestors are the attestors a pool policy may list.
var attestors = []string{protocol.AttestorJoinToken, protocol.AttestorProvisioned, protocol.AttestorDiscovery, protocol.AttestorTPM}

func (s *Server) setMachineTPM(w http.ResponseWriter, r *http.Request) error {
	var in apitype.MachineTPMSet
	if err := decode(r, &in); err != nil {
		return err
	}
	if err := machines.CheckEKSHA256(in.EKSHA256); err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	got, err := s.machines().EnrollTPM(r.Context(), m, in.EKSHA256, in.Pool)
	return s.changed(w, r, got, err)
}

func (s *Server) clearMachineTPM(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	got, err := s.machines().ClearTPM(r.Context(), m)
	return s.changed(w, r, got, err)
}

func (s *Server) createEnrollment(w http.ResponseWriter, r *http.Request) error {
	var in apitype.TPMEnrollmentCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	if err := machines.CheckEKSHA256(in.EKSHA256); err != nil {
		return err
	}
	if err := ids.CheckName("site", in.Site); err != nil {
		return err
	}
	if err := ids.CheckName("pool", in.Pool); err != nil {
		return err
	}
	e := store.TPMEnrollment{EKSHA256: in.EKSHA256, Site: in.Site, Pool: in.Pool, CreatedAt: s.now()}
	err := s.Store.EnrollTPM(r.Context(), e)
	var c *store.EKConflictError
	switch {
	case errors.As(err, &c):
		return httpjson.Errorf(protocol.CodeAlreadyExists, "%s: enroll it with better-compute machines enroll-tpm %s instead, or delete that machine", c.Error(), c.Machine)
	case errors.Is(err, store.ErrNotFound):
		return httpjson.Errorf(protocol.CodeNotFound, "site %s does not exist (better-compute sites create %s)", in.Site, in.Site)
	case err != nil:
		return err
	}
	s.log().Info("TPM enrolled", "ek_sha256", e.EKSHA256, "site", e.Site, "pool", e.Pool)
	httpjson.WriteJSON(w, http.StatusCreated, toEnrollment(e))
	return nil
}

func (s *Server) listEnrollments(w http.ResponseWriter, r *http.Request) error {
	es, err := s.Store.ListTPMEnrollments(r.Context())
	if err != nil {
		return err
	}
	out := apitype.TPMEnrollmentList{Enrollments: make([]apitype.TPMEnrollment, 0, len(es))}
	for _, e := range es {
		out.Enrollments = append(out.Enrollments, toEnrollment(e))
	}
	httpjson.WriteJSON(w, http.StatusOK, out)
	return nil
}

// revokeEnrollment removes an enrollment: a machine's through the
// machines Service (its spec), an allow-list entry directly.
func (s *Server) revokeEnrollment(w http.ResponseWriter, r *http.Request) error {
	ek := r.PathValue("ek")
	if err := machines.CheckEKSHA256(ek); err != nil {
		return err
	}
	e, err := s.Store.GetTPMEnrollment(r.Context(), ek)
	if errors.Is(err, store.ErrNotFound) {
		return httpjson.Errorf(protocol.CodeNotFound, "the TPM endorsement key %s is not enrolled", ek)
	}
	if err != nil {
		return err
	}
	if e.MachineID != "" {
		m, err := s.Store.GetMachine(r.Context(), e.MachineID)
		if err != nil {
			return err
		}
		if _, err := s.machines().ClearTPM(r.Context(), m); err != nil {
			return err
		}
	} else if err := s.Store.RevokeTPMEnrollment(r.Context(), ek, s.now()); err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	s.log().Info("TPM enrollment revoked", "ek_sha256", ek, "machine", e.MachineID)
	httpjson.WriteJSON(w, http.StatusOK, toEnrollment(e))
	return nil
}

func (s *Server) setPoolPolicy(w http.ResponseWriter, r *http.Request) error {
	pool := r.PathValue("pool")
	if err := ids.CheckName("pool", pool); err != nil {
		return err
	}
	var in apitype.PoolPolicySet
	if err := decode(r, &in); err != nil {
		return err
	}
	if in.MaxUnavailable < 0 {
		return httpjson.Errorf(protocol.CodeInvalidInput, "max_unavailable %d: want 1 or more (0: no budget set)", in.MaxUnavailable)
	}
	p := store.PoolPolicy{Pool: pool, MaxUnavailable: in.MaxUnavailable, UpdatedAt: s.now()}
	for _, a := range in.JoinAttestors {
		if !slices.Contains(attestors, a) {
			return httpjson.Errorf(protocol.CodeInvalidInput, "join_attestors: %q is not an attestor (want %s, %s, %s or %s)", human.ShortN(a, 80),
				attestors[0], attestors[1], attestors[2], attestors[3])
		}
		if !slices.Contains(p.JoinAttestors, a) {
			p.JoinAttestors = append(p.JoinAttestors, a)
		}
	}
	if err := s.Store.SetPoolPolicy(r.Context(), p); err != nil {
		return err
	}
	s.log().Info("pool policy set", "pool", pool, "join_attestors", p.JoinAttestors, "max_unavailable", p.MaxUnavailable)
	httpjson.WriteJSON(w, http.StatusOK, toPoolPolicy(p))
	return nil
}

func (s *Server) getPoolPolicy(w http.ResponseWriter, r *http.Request) error {
	pool := r.PathValue("pool")
	if err := ids.CheckName("pool", pool); err != nil {
		return err
	}
	p, err := s.Store.GetPoolPolicy(r.Context(), pool)
	switch {
	case errors.Is(err, store.ErrNotFound):
		p = store.PoolPolicy{Pool: pool}
	case err != nil:
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, toPoolPolicy(p))
	return nil
}

func (s *Server) listPoolPolicies(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.Store.ListPoolPolicies(r.Context())
	if err != nil {
		return err
	}
	out := apitype.PoolPolicyList{Pools: make([]apitype.PoolPolicy, 0, len(ps))}
	for _, p := range ps {
		out.Pools = append(out.Pools, toPoolPolicy(p))
	}
	httpjson.WriteJSON(w, http.StatusOK, out)
	return nil
}
