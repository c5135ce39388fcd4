package storetest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// ek is a made-up endorsement key hash.
func ek(c byte) string { return strings.Repeat(string([]byte{c}), 64) }

func testTPMEnrollments(t *testing.T, s store.Store) {
	for _, name := range []string{"fsn1", "ams1"} {
		if err := s.CreateSite(ctx, store.Site{Name: name, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.GetTPMEnrollment(ctx, ek('a')); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("missing enrollment: %v", err)
	}
	if err := s.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: ek('a'), Site: "nowhere", CreatedAt: time.Now()}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("enrollment in a missing site: %v, want ErrNotFound", err)
	}
	if err := s.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: ek('a'), Site: "fsn1", Pool: "pool_a", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetTPMEnrollment(ctx, ek('a'))
	if err != nil || got.Site != "fsn1" || got.Pool != "pool_a" || got.MachineID != "" || got.CreatedAt.IsZero() {
		t.Errorf("GetTPMEnrollment = %+v, %v", got, err)
	}
	// The same EK again replaces the entry.
	if err := s.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: ek('a'), Site: "ams1", Pool: "pool_b", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetTPMEnrollment(ctx, ek('a')); got.Site != "ams1" || got.Pool != "pool_b" {
		t.Errorf("re-enrolled: %+v", got)
	}
	if err := s.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: ek('a'), Site: "fsn1", MachineID: "m_1"}); err == nil {
		t.Error("EnrollTPM wrote a machine's enrollment")
	}

	// A machine's enrollment is its spec: written with UpdateMachine, on its
	// timeline, shown with the machine.
	m := newMachine(ids.New(ids.PrefixMachine, time.Now()), "fsn1", "52:54:00:00:00:11")
	if err := s.CreateMachine(ctx, m); err != nil {
		t.Fatal(err)
	}
	got2, err := s.UpdateMachine(ctx, m.ID, store.MachineUpdate{SetTPM: true, TPM: &store.TPMEnrollment{EKSHA256: ek('b'), Pool: "pool_c"}, At: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if got2.TPMEKSHA256 != ek('b') || got2.TPMPool != "pool_c" {
		t.Errorf("machine after enroll: ek %q pool %q", got2.TPMEKSHA256, got2.TPMPool)
	}
	e, err := s.GetTPMEnrollment(ctx, ek('b'))
	if err != nil || e.MachineID != m.ID || e.Site != "fsn1" || e.Pool != "pool_c" {
		t.Errorf("machine's enrollment %+v, %v", e, err)
	}
	evs, _ := s.MachineEvents(ctx, m.ID, 0)
	if len(evs) == 0 || evs[len(evs)-1].Kind != protocol.MachineEventTPM || !strings.Contains(evs[len(evs)-1].Message, ek('b')) {
		t.Errorf("timeline after enroll: %+v", evs)
	}
	// An allow-list entry's EK becomes the machine's; the machine's old EK goes.
	if _, err := s.UpdateMachine(ctx, m.ID, store.MachineUpdate{SetTPM: true, TPM: &store.TPMEnrollment{EKSHA256: ek('a')}, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.GetTPMEnrollment(ctx, ek('a')); e.MachineID != m.ID || e.Site != "fsn1" || e.Pool != "" {
		t.Errorf("allow-list EK given to the machine: %+v", e)
	}
	if _, err := s.GetTPMEnrollment(ctx, ek('b')); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the machine's previous EK: %v, want ErrNotFound", err)
	}
	// Another machine cannot take it, nor an allow-list entry.
	m2 := newMachine(ids.New(ids.PrefixMachine, time.Now()), "fsn1", "52:54:00:00:00:12")
	if err := s.CreateMachine(ctx, m2); err != nil {
		t.Fatal(err)
	}
	var c *store.EKConflictError
	_, err = s.UpdateMachine(ctx, m2.ID, store.MachineUpdate{SetTPM: true, TPM: &store.TPMEnrollment{EKSHA256: ek('a')}, At: time.Now()})
	if !errors.Is(err, store.ErrEKEnrolled) || !errors.As(err, &c) || c.Machine != m.ID {
		t.Errorf("another machine's EK: %v", err)
	}
	if err := s.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: ek('a'), Site: "fsn1", CreatedAt: time.Now()}); !errors.Is(err, store.ErrEKEnrolled) {
		t.Errorf("allow-list entry of a machine's EK: %v", err)
	}

	list, err := s.ListTPMEnrollments(ctx)
	if err != nil || len(list) != 1 || list[0].EKSHA256 != ek('a') {
		t.Errorf("ListTPMEnrollments = %+v, %v", list, err)
	}
	if err := s.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: ek('c'), Site: "ams1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.ListTPMEnrollments(ctx); len(list) != 2 {
		t.Errorf("ListTPMEnrollments after a second: %+v", list)
	}

	// Revoking a machine's EK goes on its timeline and off the machine.
	if err := s.RevokeTPMEnrollment(ctx, ek('a'), time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetMachine(ctx, m.ID); got.TPMEKSHA256 != "" {
		t.Errorf("machine after revoke: ek %q", got.TPMEKSHA256)
	}
	evs, _ = s.MachineEvents(ctx, m.ID, 0)
	if evs[len(evs)-1].Kind != protocol.MachineEventTPM || !strings.Contains(evs[len(evs)-1].Message, "revoked") {
		t.Errorf("timeline after revoke: %+v", evs[len(evs)-1])
	}
	if err := s.RevokeTPMEnrollment(ctx, ek('a'), time.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("revoke again: %v, want ErrNotFound", err)
	}
	if err := s.RevokeTPMEnrollment(ctx, ek('c'), time.Now()); err != nil {
		t.Errorf("revoke an allow-list entry: %v", err)
	}

	// SetTPM nil removes the machine's; deleting the machine removes it too.
	if _, err := s.UpdateMachine(ctx, m2.ID, store.MachineUpdate{SetTPM: true, TPM: &store.TPMEnrollment{EKSHA256: ek('d')}, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.UpdateMachine(ctx, m2.ID, store.MachineUpdate{SetTPM: true, At: time.Now()}); got.TPMEKSHA256 != "" {
		t.Errorf("after SetTPM nil: %q", got.TPMEKSHA256)
	}
	if _, err := s.UpdateMachine(ctx, m2.ID, store.MachineUpdate{SetTPM: true, TPM: &store.TPMEnrollment{EKSHA256: ek('d')}, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMachine(ctx, m2.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetTPMEnrollment(ctx, ek('d')); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a deleted machine's enrollment: %v, want ErrNotFound", err)
	}
}

// testAdmitEnrollsTPM: the join of an approved machine's TPM enrolls its EK
// in the transaction that writes the node, and not at all when the join
// fails.
func testAdmitEnrollsTPM(t *testing.T, s store.Store) {
	if err := s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	m := newMachine(ids.New(ids.PrefixMachine, time.Now()), "fsn1", "52:54:00:00:00:21")
	if err := s.CreateMachine(ctx, m); err != nil {
		t.Fatal(err)
	}
	n := newNode("n_tpm1")
	n.TPMEKSHA256 = ek('e')
	enr := &store.TPMEnrollment{EKSHA256: ek('e'), Site: "fsn1", MachineID: m.ID}
	if err := s.Admit(ctx, store.Admission{Node: n, Machine: m.ID, TPMEnrollment: enr, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetMachine(ctx, m.ID); got.TPMEKSHA256 != ek('e') || got.BoundNode != n.ID {
		t.Errorf("machine after the join: ek %q bound %q", got.TPMEKSHA256, got.BoundNode)
	}
	// A join whose token is used writes no enrollment.
	tok, _ := newToken(t, s, nil)
	if err := s.Admit(ctx, store.Admission{TokenID: tok.ID, Node: newNode("n_tpm2"), Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	m2 := newMachine(ids.New(ids.PrefixMachine, time.Now()), "fsn1", "52:54:00:00:00:22")
	if err := s.CreateMachine(ctx, m2); err != nil {
		t.Fatal(err)
	}
	err := s.Admit(ctx, store.Admission{TokenID: tok.ID, Node: newNode("n_tpm3"), TPMEnrollment: &store.TPMEnrollment{EKSHA256: ek('f'), Site: "fsn1", MachineID: m2.ID}, Now: time.Now()})
	if !errors.Is(err, store.ErrTokenUsed) {
		t.Fatalf("used token: %v", err)
	}
	if _, err := s.GetTPMEnrollment(ctx, ek('f')); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused join enrolled its EK: %v", err)
	}
	// Another machine's EK is refused, and so is the node.
	err = s.Admit(ctx, store.Admission{Node: newNode("n_tpm4"), TPMEnrollment: &store.TPMEnrollment{EKSHA256: ek('e'), Site: "fsn1", MachineID: m2.ID}, Now: time.Now()})
	if !errors.Is(err, store.ErrEKEnrolled) {
		t.Errorf("another machine's EK: %v", err)
	}
	if _, err := s.GetNode(ctx, "n_tpm4"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the refused node was written: %v", err)
	}
	err = s.Admit(ctx, store.Admission{Node: newNode("n_tpm5"), TPMEnrollment: &store.TPMEnrollment{EKSHA256: ek('g'), Site: "fsn1", MachineID: "m_gone"}, Now: time.Now()})
	if !errors.Is(err, store.ErrNoMachine) {
		t.Errorf("a machine that is gone: %v", err)
	}
}

func testPoolPolicies(t *testing.T, s store.Store) {
	if _, err := s.GetPoolPolicy(ctx, "pool_a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("no policy: %v", err)
	}
	if list, err := s.ListPoolPolicies(ctx); err != nil || len(list) != 0 {
		t.Fatalf("ListPoolPolicies of none: %+v %v", list, err)
	}
	p := store.PoolPolicy{Pool: "pool_a", JoinAttestors: []string{protocol.AttestorTPM, protocol.AttestorJoinToken}, UpdatedAt: time.Now()}
	if err := s.SetPoolPolicy(ctx, p); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetPoolPolicy(ctx, "pool_a")
	if err != nil || !slices.Equal(got.JoinAttestors, p.JoinAttestors) || got.UpdatedAt.IsZero() {
		t.Errorf("GetPoolPolicy = %+v, %v", got, err)
	}
	if !got.Allows(protocol.AttestorTPM) || got.Allows(protocol.AttestorDiscovery) || !(store.PoolPolicy{}).Allows(protocol.AttestorDiscovery) {
		t.Error("Allows")
	}
	p.JoinAttestors = []string{protocol.AttestorTPM}
	if err := s.SetPoolPolicy(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetPoolPolicy(ctx, "pool_a"); !slices.Equal(got.JoinAttestors, []string{protocol.AttestorTPM}) {
		t.Errorf("replaced: %+v", got)
	}
	if err := s.SetPoolPolicy(ctx, store.PoolPolicy{Pool: "pool_b", JoinAttestors: []string{protocol.AttestorJoinToken}, UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if list, _ := s.ListPoolPolicies(ctx); len(list) != 2 || list[0].Pool != "pool_a" || list[1].Pool != "pool_b" || list[0].MaxUnavailable != 0 {
		t.Errorf("ListPoolPolicies = %+v", list)
	}
	// A disruption budget alone is a policy; it admits every attestor.
	if err := s.SetPoolPolicy(ctx, store.PoolPolicy{Pool: "pool_c", MaxUnavailable: 3, UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetPoolPolicy(ctx, "pool_c"); err != nil || got.MaxUnavailable != 3 || !got.Allows(protocol.AttestorDiscovery) {
		t.Errorf("budget-only policy = %+v, %v", got, err)
	}
	if err := s.SetPoolPolicy(ctx, store.PoolPolicy{Pool: "pool_c", UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// No attestors: no policy.
	if err := s.SetPoolPolicy(ctx, store.PoolPolicy{Pool: "pool_a", UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetPoolPolicy(ctx, "pool_a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cleared policy: %v", err)
	}
}
