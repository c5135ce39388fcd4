package selfupdate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/internal/buildmode"
)

// fakeHWRefuses is what the systemd tests check in a fakehw build (make test
// runs this package with -tags fakehw too): such a build never writes the
// rollback unit, so New refuses Options.Systemd, and the test ends there.
func fakeHWRefuses(t *testing.T) bool {
	t.Helper()
	if !buildmode.FakeHW {
		return false
	}
	h := newHost(t)
	h.opts.Systemd = true
	if _, err := New(h.opts); err == nil || !strings.Contains(err.Error(), "a fakehw build never writes the systemd rollback unit") {
		t.Fatalf("New with Systemd in a fakehw build: %v, want the refusal", err)
	}
	return true
}

// fakeSystemctl puts a systemctl on PATH that records its arguments. It
// stands in for systemd, which does not run in the test environment: the
// test checks that bcd asks for a daemon-reload, not what systemd does then.
func fakeSystemctl(t *testing.T) (log string) {
	t.Helper()
	dir := t.TempDir()
	log = filepath.Join(dir, "calls")
	script := "#!/bin/sh\necho \"$@\" >> '" + log + "'\n"
	must(t, os.WriteFile(filepath.Join(dir, "systemctl"), []byte(script), 0o755))
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return log
}

func calls(t *testing.T, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if os.IsNotExist(err) {
		return nil
	}
	must(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// TestSystemdRollbackUnit: under systemd the first update writes the unit
// and the drop-in and reloads; a later update with the same content writes
// nothing and does not reload; a changed drop-in is rewritten.
func TestSystemdRollbackUnit(t *testing.T) {
	if fakeHWRefuses(t) {
		return
	}
	log := fakeSystemctl(t)
	h := newHost(t)
	h.opts.Systemd = true
	h.update("0.1.0", h.section("0.2.0", 5))

	unit := RollbackUnitPath(h.opts.UnitDir)
	dropIn := DropInPath(h.opts.UnitDir)
	wantUnit := RollbackUnitText(h.slotsDir(), h.opts.ConfigPath)
	if got := string(h.read(unit)); got != wantUnit {
		t.Errorf("%s:\n%s\nwant:\n%s", unit, got, wantUnit)
	}
	for _, line := range []string{
		"Type=oneshot",
		"ExecStart=" + filepath.Join(h.slotsDir(), PreviousLink) + " update --rollback --config " + h.opts.ConfigPath,
		"ExecStartPost=/bin/systemctl reset-failed bcd.service",
		"ExecStartPost=/bin/systemctl --no-block start bcd.service",
	} {
		if !strings.Contains(wantUnit, line+"\n") {
			t.Errorf("the unit lacks %q", line)
		}
	}
	if got := string(h.read(dropIn)); got != DropInText {
		t.Errorf("%s:\n%s", dropIn, got)
	}
	for _, line := range []string{"[Unit]", "StartLimitIntervalSec=600", "StartLimitBurst=5", "OnFailure=bcd-rollback.service"} {
		if !strings.Contains(DropInText, line+"\n") {
			t.Errorf("the drop-in lacks %q", line)
		}
	}
	if filepath.Base(filepath.Dir(dropIn)) != "bcd.service.d" || filepath.Base(dropIn) != "50-bcd-rollback.conf" || filepath.Base(unit) != "bcd-rollback.service" {
		t.Errorf("paths %s %s", unit, dropIn)
	}
	if got := calls(t, log); len(got) != 1 || got[0] != "daemon-reload" {
		t.Errorf("systemctl calls %q, want one daemon-reload", got)
	}

	h.confirm("0.2.0")
	h.update("0.2.0", h.section("0.3.0", 6))
	if got := calls(t, log); len(got) != 1 {
		t.Errorf("systemctl calls %q after an update that changed no unit", got)
	}

	h.confirm("0.3.0")
	must(t, os.WriteFile(dropIn, []byte("[Unit]\nStartLimitBurst=50\n"), 0o644))
	h.update("0.3.0", h.section("0.4.0", 7))
	if got := string(h.read(dropIn)); got != DropInText {
		t.Errorf("the changed drop-in was not rewritten: %q", got)
	}
	if got := calls(t, log); len(got) != 2 || got[1] != "daemon-reload" {
		t.Errorf("systemctl calls %q, want a second daemon-reload", got)
	}
}

// TestSystemdReloadFails: a failed daemon-reload fails the swap before
// current moves.
func TestSystemdReloadFails(t *testing.T) {
	if fakeHWRefuses(t) {
		return
	}
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "systemctl"), []byte("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n"), 0o755))
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	h := newHost(t)
	h.opts.Systemd = true
	m := h.manager("0.1.0")
	p, err := m.Prepare(t.Context(), h.section("0.2.0", 5), testNow)
	must(t, err)
	err = m.Swap(t.Context(), p, "cmd", 1)
	if err == nil || !strings.Contains(err.Error(), "Failed to connect to bus") {
		t.Fatalf("got %v, want the daemon-reload failure", err)
	}
	if h.link(CurrentLink) != "bcd-a" {
		t.Errorf("current -> %q after a failed swap", h.link(CurrentLink))
	}
	if _, ok := h.upgradeRecord(); ok {
		t.Error("upgrade.json was written")
	}
}
