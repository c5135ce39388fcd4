// Package lograte bounds how often a kind of log line is written. A server that
// logs every refusal it makes lets whoever sends it requests fill its log (and its
// disk, and the operator's view) at line rate: 1,000 refused joins a second were
// 1,000 INFO lines. A Limiter lets one line through per interval and counts the
// rest, so the next line says how many were left out; the exact totals belong in
// counters (metrics), which cost nothing per event.
package lograte

import (
	"sync"
	"time"
)

// DefaultEvery is the interval of a zero Limiter: at most one line a second.
const DefaultEvery = time.Second

// Limiter lets at most one line through per Every. Safe for concurrent use; the
// zero value is ready, at DefaultEvery.
type Limiter struct {
	// Every is the least time between two lines let through; 0 means DefaultEvery.
	Every time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu         sync.Mutex
	next       time.Time
	suppressed uint64
}

// Allow reports whether a line may be written now and, when it may, how many
// lines Allow refused since the last one it let through: the caller logs that
// count with the line ("suppressed", n).
func (l *Limiter) Allow() (ok bool, suppressed uint64) {
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	t := now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	every := l.Every
	if every <= 0 {
		every = DefaultEvery
	}
	l.next = t.Add(every)
	n := l.suppressed
	l.suppressed = 0
	return true, n
}
