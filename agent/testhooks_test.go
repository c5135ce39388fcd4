package agent

import (
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/buildmode"
	"github.com/better-compute/bcd/protocol"
)

// TestTestHooksOnlyInFakeHW: the test hooks change nothing in a host build
// (this test binary, unless built with -tags fakehw) and work in a fakehw one.
func TestTestHooksOnlyInFakeHW(t *testing.T) {
	t.Setenv(EnvTestProtocolVersion, "7")
	t.Setenv(EnvTestUpdateDeadline, "5s")
	wantVersion, wantDeadline := protocol.Version, time.Minute
	if buildmode.FakeHW {
		wantVersion, wantDeadline = 7, 5*time.Second
	}
	if v := helloProtocolVersion(); v != wantVersion {
		t.Errorf("protocol_version %d, want %d (fakehw %v)", v, wantVersion, buildmode.FakeHW)
	}
	if d := TestDuration(EnvTestUpdateDeadline, time.Minute); d != wantDeadline {
		t.Errorf("deadline %s, want %s", d, wantDeadline)
	}
	t.Setenv(EnvTestUpdateDeadline, "soon")
	if d := TestDuration(EnvTestUpdateDeadline, time.Minute); d != time.Minute {
		t.Errorf("a bad duration gave %s, want the default", d)
	}
}
