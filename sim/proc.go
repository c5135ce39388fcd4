package sim

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ProcStats are a process's peak resident memory and the CPU it used over a run.
type ProcStats struct {
	PID     int           `json:"pid"`
	PeakRSS int64         `json:"peak_rss_bytes"`
	CPU     time.Duration `json:"cpu_ns"`
}

// clockTick is USER_HZ, the unit of /proc/PID/stat's times: 100 on Linux.
const clockTick = 100

// procSample reads a process's RSS (bytes) and CPU (user+system) from /proc.
func procSample(pid int) (rss int64, cpu time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name is in parentheses and may hold spaces: fields follow the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 22 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	pages, _ := strconv.ParseInt(f[21], 10, 64)
	return pages * int64(os.Getpagesize()), time.Duration(ut+st) * time.Second / clockTick, nil
}

// Load is the host's load average over a run: the highest 1-minute figure seen
// and the three figures at the end. On the 2-core machine every process of a run
// (serve, bcd site, sim) shares the cores, so a load above 2 says the figures
// were taken on a saturated host.
type Load struct {
	Peak1 float64    `json:"peak_1m"`
	End   [3]float64 `json:"end"`
	CPUs  int        `json:"cpus"`
}

// loadavgFile is the kernel's load average.
const loadavgFile = "/proc/loadavg"

// parseLoadavg reads /proc/loadavg's first three fields.
func parseLoadavg(b []byte) ([3]float64, error) {
	var l [3]float64
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return l, fmt.Errorf("%s: %d fields, want at least 3", loadavgFile, len(f))
	}
	for i := range l {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return l, fmt.Errorf("%s: field %d %q: %w", loadavgFile, i+1, f[i], err)
		}
		l[i] = v
	}
	return l, nil
}

// watcher samples processes every 200 ms: peak RSS (sampled, beside VmHWM which
// the kernel keeps for the process's whole life) and CPU used since it started;
// and the host's load average.
type watcher struct {
	fns     map[string]func() int
	loadavg string // loadavgFile; a test's file
	mu      sync.Mutex
	stats   map[string]*ProcStats
	start   map[string]time.Duration
	load    Load
	done    chan struct{}
	wg      sync.WaitGroup
}

func startWatch(pids map[string]func() int) *watcher {
	return startWatchLoad(pids, loadavgFile)
}

func startWatchLoad(pids map[string]func() int, loadavg string) *watcher {
	w := &watcher{fns: pids, loadavg: loadavg, stats: map[string]*ProcStats{}, start: map[string]time.Duration{}, done: make(chan struct{}),
		load: Load{CPUs: runtime.NumCPU()}}
	for name, fn := range pids {
		pid := fn()
		if pid <= 0 {
			continue
		}
		rss, cpu, err := procSample(pid)
		if err != nil {
			continue
		}
		w.stats[name] = &ProcStats{PID: pid, PeakRSS: rss}
		w.start[name] = cpu
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-t.C:
				w.sample()
			}
		}
	}()
	return w
}

func (w *watcher) sample() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if b, err := os.ReadFile(w.loadavg); err == nil {
		if l, err := parseLoadavg(b); err == nil {
			w.load.Peak1 = max(w.load.Peak1, l[0])
			w.load.End = l
		}
	}
	for name, s := range w.stats {
		if pid := w.fns[name](); pid > 0 && pid != s.PID {
			w.rebaseLocked(name, pid)
		}
		rss, cpu, err := procSample(s.PID)
		if err != nil {
			continue // restarted by a fault: its successor is not this PID
		}
		s.PeakRSS = max(s.PeakRSS, rss)
		s.CPU = cpu - w.start[name]
	}
}

// rebaseLocked points name at a new PID (a service restarted by a fault): its CPU
// so far is kept and the new process's added.
func (w *watcher) rebaseLocked(name string, pid int) {
	s := w.stats[name]
	if s == nil {
		return
	}
	_, cpu, err := procSample(pid)
	if err != nil {
		return
	}
	s.PID = pid
	w.start[name] = cpu - s.CPU
}

func (w *watcher) stop() (map[string]ProcStats, Load) {
	close(w.done)
	w.wg.Wait()
	w.sample()
	out := map[string]ProcStats{}
	for n, s := range w.stats {
		out[n] = *s
	}
	return out, w.load
}

// selfPeakRSS is this process's VmHWM.
func selfPeakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
