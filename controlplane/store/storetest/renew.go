package storetest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
)

// testRenewNodeCert: a renewal replaces the certificate in one write, only while
// the certificate it read is still current; a reclaim forgets the replaced one.
func testRenewNodeCert(t *testing.T, s store.Store) {
	n := newNode("n_r")
	n.CertKeySHA256 = "k1"
	if err := s.Admit(ctx, store.Admission{Node: n, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetNode(ctx, "n_r")
	if got.CertKeySHA256 != "k1" || got.PrevCertSerial != "" {
		t.Fatalf("after the join: key %q prev %q", got.CertKeySHA256, got.PrevCertSerial)
	}
	later := time.Now().Add(3 * time.Hour).Truncate(time.Millisecond)
	r := store.CertRenewal{NodeID: "n_r", Replaces: "1", Presented: "1", Serial: "2", NotAfter: later, KeySHA256: "k2", At: time.Now()}
	if err := s.RenewNodeCert(ctx, r); err != nil {
		t.Fatal(err)
	}
	got, _ = s.GetNode(ctx, "n_r")
	if got.CertSerial != "2" || !got.CertNotAfter.Equal(later) || got.CertKeySHA256 != "k2" || got.PrevCertSerial != "1" {
		t.Errorf("after renewal: serial %q not_after %v key %q prev %q", got.CertSerial, got.CertNotAfter, got.CertKeySHA256, got.PrevCertSerial)
	}
	if got.State != n.State || got.SPIFFEID != n.SPIFFEID {
		t.Errorf("renewal changed more than the certificate: %+v", got)
	}
	// The same renewal again: serial 1 is no longer current.
	if err := s.RenewNodeCert(ctx, r); !errors.Is(err, store.ErrCertReplaced) {
		t.Errorf("renewing a replaced certificate: %v, want ErrCertReplaced", err)
	}
	// A retry of a renewal whose answer was lost: it replaces 2, presents 1.
	retry := store.CertRenewal{NodeID: "n_r", Replaces: "2", Presented: "1", Serial: "3", NotAfter: later, KeySHA256: "k2", At: time.Now()}
	if err := s.RenewNodeCert(ctx, retry); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.GetNode(ctx, "n_r"); got.CertSerial != "3" || got.PrevCertSerial != "1" {
		t.Errorf("after the retry: serial %q prev %q", got.CertSerial, got.PrevCertSerial)
	}

	// Two renewals of the same certificate at once: exactly one wins.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.RenewNodeCert(ctx, store.CertRenewal{NodeID: "n_r", Replaces: "3", Presented: "3",
				Serial: string(rune('a' + i)), NotAfter: later, KeySHA256: "k", At: time.Now()})
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, store.ErrCertReplaced):
			t.Errorf("a concurrent renewal: %v", err)
		}
	}
	if won != 1 {
		t.Errorf("%d concurrent renewals of one certificate won, want 1", won)
	}

	// A reclaim is a new join: no renewal is pending any more.
	got, _ = s.GetNode(ctx, "n_r")
	n.CertSerial, n.CertKeySHA256 = "9", "k9"
	if err := s.Admit(ctx, store.Admission{Node: n, Reclaim: true, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got, _ = s.GetNode(ctx, "n_r"); got.CertSerial != "9" || got.CertKeySHA256 != "k9" || got.PrevCertSerial != "" {
		t.Errorf("after a reclaim: serial %q key %q prev %q", got.CertSerial, got.CertKeySHA256, got.PrevCertSerial)
	}

	if err := s.RenewNodeCert(ctx, store.CertRenewal{NodeID: "n_none", Replaces: "1", Serial: "2", At: time.Now()}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("renewing an unknown node: %v, want ErrNotFound", err)
	}
	if err := s.DeleteNode(ctx, "n_r", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.RenewNodeCert(ctx, store.CertRenewal{NodeID: "n_r", Replaces: "9", Presented: "9", Serial: "10", At: time.Now()}); !errors.Is(err, store.ErrNodeDeleted) {
		t.Errorf("renewing a deleted node: %v, want ErrNodeDeleted", err)
	}
}
