package lograte

import (
	"sync"
	"testing"
	"time"
)

// TestLimiter: on a stepped clock, one line per interval passes and each says how
// many were refused since the previous one; nothing is lost from the count.
func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := &Limiter{Every: time.Second, Now: func() time.Time { return now }}
	var passed, reported uint64
	for i := range 1000 {
		// 1,000 calls over 2.5 s: at 0, 1, 2 s.
		now = time.Unix(1000, 0).Add(time.Duration(i) * 2500 * time.Microsecond)
		if ok, n := l.Allow(); ok {
			passed++
			reported += n
		}
	}
	if passed != 3 {
		t.Errorf("%d lines passed, want 3 (at 0 s, 1 s and 2 s)", passed)
	}
	// The 199 after the last line are still pending; the next line reports them.
	now = now.Add(time.Second)
	ok, n := l.Allow()
	if !ok || reported+n+passed != 1000 {
		t.Errorf("passed %d, reported %d suppressed, then %v with %d: want 1,000 in all", passed, reported, ok, n)
	}
}

// TestLimiterConcurrent: under concurrent callers the count stays exact.
func TestLimiterConcurrent(t *testing.T) {
	var l Limiter // the zero value, on the real clock
	var mu sync.Mutex
	var passed, reported uint64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				if ok, n := l.Allow(); ok {
					mu.Lock()
					passed++
					reported += n
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	l.mu.Lock()
	pending := l.suppressed
	l.mu.Unlock()
	if passed+reported+pending != 4000 {
		t.Errorf("passed %d + reported %d + pending %d != 4000", passed, reported, pending)
	}
}
