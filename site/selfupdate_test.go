package site_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/daemonupdate"
	"github.com/better-compute/bcd/agent/daemonupdate/updatetest"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/protocol"
)

// TestSiteSelfUpdateClosesEverything: a daemon section swaps bcd site's slot,
// and Run returns daemonupdate.ErrExec only once the boot server's port and
// the journal are free for the new binary. Nothing execs here: cmd/bcd does
// that after Run (the real exec is internal/e2e's TestSelfUpdateRealExec).
func TestSiteSelfUpdateClosesEverything(t *testing.T) {
	f := newFixture(t, "site", true)
	rel := updatetest.New(t, f.g.API)
	entry := filepath.Join(t.TempDir(), "bcd")
	if err := os.WriteFile(entry, []byte("#!/bin/sh\necho bcd site\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	appendFile(t, f.cfgPath, fmt.Sprintf("\n[update]\nrelease_pins = %q\nentrypoint = %q\n", rel.Pin, entry))
	f.cfg = loadConfig(t, f.cfgPath)
	sec := rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.0 for the site"))
	raw, _ := json.Marshal(sec)
	f.setSpec(protocol.Spec{Revision: 3, Sections: map[string]json.RawMessage{protocol.SectionDaemon: raw}})

	s, log := newSite(f)
	s.DHCPAddr, s.PXEAddr = "127.0.0.1:0", "127.0.0.1:0"
	s.DHCPBroadcast = f.dhcpCli.LocalAddr().(*net.UDPAddr).AddrPort()
	units := t.TempDir()
	s.UpdateOptions = func(o *selfupdate.Options) { o.Systemd, o.UnitDir = false, units }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case err := <-done:
		if !errors.Is(err, daemonupdate.ErrExec) {
			t.Fatalf("Run = %v, want ErrExec\n%s", err, log)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no swap\n%s", log)
	}
	if target, _ := os.Readlink(filepath.Join(f.dataDir, "bin", selfupdate.CurrentLink)); target != "bcd-b" {
		t.Errorf("current links to %q", target)
	}
	if ev := f.rec.events(protocol.EventSectionStatus); len(ev) == 0 {
		t.Error("no section status before the swap")
	}
	// What the new binary opens first is free.
	l, err := net.Listen("tcp", f.httpAddr)
	if err != nil {
		t.Fatalf("the boot HTTP port is still taken: %v", err)
	}
	l.Close()
	j, err := journal.Open(f.cfg.JournalOrDefault().Path, "site_a", journal.Options{LockTimeout: time.Second})
	if err != nil {
		t.Fatalf("the journal is still locked: %v", err)
	}
	j.Close()
}
