package sim

import (
	"bytes"
	"fmt"
	"os"
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

// watcher samples processes every 200 ms: peak RSS (sampled, beside VmHWM which
// the kernel keeps for the process's whole life) and CPU used since it started.
type watcher struct {
	fns   map[string]func() int
	mu    sync.Mutex
	stats map[string]*ProcStats
	start map[string]time.Duration
	done  chan struct{}
	wg    sync.WaitGroup
}

func startWatch(pids map[string]func() int) *watcher {
	w := &watcher{fns: pids, stats: map[string]*ProcStats{}, start: map[string]time.Duration{}, done: make(chan struct{})}
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

func (w *watcher) stop() map[string]ProcStats {
	w.sample()
	close(w.done)
	w.wg.Wait()
	out := map[string]ProcStats{}
	for n, s := range w.stats {
		out[n] = *s
	}
	return out
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
