package simlab

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// TestSessionBench runs make bench-sessions' code at 50 sessions, so that the
// benchmark cannot rot: 50 nodes joined through the shipped serve by two load
// generators, all their sessions welcomed (by the load generators' counts,
// serve's gauge and its log), serve's memory read before and after, and none
// dropped during a window long enough for the gateway's 15 s heartbeat to
// reach every session.
func TestSessionBench(t *testing.T) {
	const n = 50
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ip")
	testenv.NeedTool(t, "sysctl")
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	// Two load generators, as make bench-sessions needs for 10,000 sessions
	// where the hard RLIMIT_NOFILE is 20,000.
	b := &SessionBench{Dir: t.TempDir(), BetterCompute: bins.BetterCompute, Loadgen: sessionbench, Sessions: n, Loadgens: 2,
		Settle: time.Second, Quiet: time.Second, Steady: 16 * time.Second, ConnectTimeout: time.Minute, Log: logWriter{t}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	start := time.Now()
	r, err := b.Run(ctx)
	if err != nil {
		t.Fatalf("%v\n%s", err, b.Diagnostics())
	}
	var rep strings.Builder
	r.Report(&rep)
	t.Logf("run %s:\n%s", time.Since(start).Round(time.Second), rep.String())
	if !r.OK() {
		t.Fatalf("checks failed: %q\n%s", r.Failures, b.Diagnostics())
	}
	if r.ServeBefore.RSS <= 0 || r.ServeWelcomed.RSS <= r.ServeBefore.RSS || r.ServeBefore.HeapInuse <= 0 {
		t.Errorf("serve's memory: RSS %d before, %d all welcomed; heap in use %v before", r.ServeBefore.RSS, r.ServeWelcomed.RSS, r.ServeBefore.HeapInuse)
	}
	if r.Joins <= 0 || r.Connect <= 0 || r.ServeWindowEnd.CPU <= 0 {
		t.Errorf("joins %s, connect %s, serve CPU %v: not measured", r.Joins, r.Connect, r.ServeWindowEnd.CPU)
	}
	// Every session's gateway heartbeat fell in the window: a ping and its
	// pong at least.
	if r.TCPSegments < 2*n {
		t.Errorf("%d TCP segments in the window, want at least %d (a ping and a pong per session)", r.TCPSegments, 2*n)
	}
}
