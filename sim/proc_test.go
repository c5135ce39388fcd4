package sim

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestWatchRecordsSimCPUAndLoad: a run's watcher records sim's own CPU beside the
// services' and the host's load average (the highest 1-minute figure and the
// last), and the result prints both.
func TestWatchRecordsSimCPUAndLoad(t *testing.T) {
	loadavg := filepath.Join(t.TempDir(), "loadavg")
	set := func(v string) {
		if err := os.WriteFile(loadavg, []byte(v+" 2/300 1234\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set("1.50 0.80 0.40")
	w := startWatchLoad(map[string]func() int{SimProcess: os.Getpid}, loadavg)
	// Work for 300 ms of CPU (not of wall time: on a loaded machine that is
	// less): hashing, as sim's deploys do.
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	busy := cpu()
	buf := make([]byte, 1<<20)
	for cpu()-busy < 300*time.Millisecond {
		sha256.Sum256(buf)
	}
	set("3.25 1.00 0.50")
	time.Sleep(500 * time.Millisecond)
	set("2.00 1.10 0.60")
	procs, load := w.stop()
	p, ok := procs[SimProcess]
	if !ok || p.PID != os.Getpid() || p.CPU < 100*time.Millisecond || p.PeakRSS <= 0 {
		t.Fatalf("sim's stats %+v (recorded %v), want its PID, ≥ 100 ms of CPU and an RSS", p, ok)
	}
	if load.Peak1 != 3.25 || load.End != [3]float64{2, 1.1, 0.6} || load.CPUs <= 0 {
		t.Errorf("load %+v, want peak 3.25, end 2 1.1 0.6 and the CPUs", load)
	}
	r := &Result{Provision: time.Second, Processes: procs, Load: load}
	out := r.String()
	for _, want := range []string{"sim      peak RSS", "host     load average: peak 3.25 (1 min) during the run, 2.00 1.10 0.60 at its end"} {
		if !strings.Contains(out, want) {
			t.Errorf("result lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "sim      peak RSS") != 1 {
		t.Errorf("sim's line twice:\n%s", out)
	}
	if _, err := parseLoadavg([]byte("1.0 2.0\n")); err == nil {
		t.Error("a loadavg of two fields parsed")
	}
}
