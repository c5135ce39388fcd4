package helper

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/daemonupdate/updatetest"
	"github.com/better-compute/bcd/agent/selfupdate"
)

// TestUpdateClientThroughBcdHelper: the node's UpdateClient against the real
// Server in this process, with a real signed release: Prepare has the helper
// verify and stages the download; the helper swaps it into its slots after
// verifying the section Swap sends again; the new version confirms. A release
// the helper's pins did not sign comes back as a *selfupdate.Refusal, and
// nothing is staged for it.
func TestUpdateClientThroughBcdHelper(t *testing.T) {
	r := newRelease(t)
	s, _ := newServer(t, r.tr)
	run := served(t, s)
	ctx := context.Background()
	local := func(running string) *UpdateClient {
		m, err := selfupdate.New(selfupdate.Options{SlotsDir: r.tr.slots, RecordsDir: r.tr.slots, DataDir: r.tr.data,
			Entrypoint: r.tr.entry, Running: running, HTTPClient: r.Server.Client()})
		if err != nil {
			t.Fatal(err)
		}
		return NewUpdateClient(client(r.tr), running, m)
	}
	u := local("0.1.0")
	if out, err := u.Resume(); err != nil || out.State != selfupdate.None {
		t.Fatalf("Resume = %+v, %v", out, err)
	}

	unpinned := updatetest.New(t, updatetest.TLSServer).Section(t, "0.2.0", 2, body("0.2.0"))
	_, err := u.Prepare(ctx, unpinned, time.Now())
	if ref, ok := selfupdate.IsRefusal(err); !ok || !strings.HasPrefix(ref.Code, "RELEASE_") {
		t.Fatalf("a release signed by an unpinned key: %v; want a RELEASE_* refusal", err)
	}
	staged := filepath.Join(r.tr.data, selfupdate.StagingDir, selfupdate.StagedName("0.2.0"))
	if _, err := os.Stat(staged); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused release was staged: %v", err)
	}

	sec := r.Section(t, "0.2.0", 2, body("0.2.0"))
	plan, err := u.Prepare(ctx, sec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(staged); err != nil || !bytes.Equal(got, body("0.2.0")) {
		t.Fatalf("staged: %q, %v", got, err)
	}
	// bcd node runs as nobody and its download is nobody's; this test runs
	// as root, so it gives the file to nobody as the node would have made it.
	for _, p := range []string{filepath.Dir(staged), staged} {
		if err := os.Chown(p, nodeUID, nodeGID); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.Swap(ctx, plan, "cmd-9", 4); err != nil {
		t.Fatal(err)
	}
	st := status(t, s)
	if st.Pending == nil || st.Pending.Version != "0.2.0" || st.Pending.CommandID != "cmd-9" || st.Current != "b" {
		t.Fatalf("after the swap: %+v", st)
	}
	if got, _ := os.ReadFile(filepath.Join(r.tr.slots, "bcd-b")); !bytes.Equal(got, body("0.2.0")) {
		t.Fatalf("bcd-b is %q", got)
	}
	out, err := local("0.2.0").Confirm()
	if err != nil || out.State != selfupdate.Confirmed || out.CommandID != "cmd-9" || out.Revision != 4 {
		t.Fatalf("Confirm from 0.2.0 = %+v, %v", out, err)
	}
	if st := status(t, s); st.Pending != nil || st.Floor != 2 {
		t.Errorf("after the confirm: %+v", st)
	}
	select {
	case <-run.done:
	case <-time.After(wait):
		t.Fatal("the helper did not stop to re-exec after the confirm")
	}
}
