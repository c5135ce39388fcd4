package sqlite

import (
	"context"
	"slices"
	"sync"

	"github.com/better-compute/bcd/controlplane/store"
)

// maxPriorityStreak bounds the writes with priority (store.WithPriority) that
// go ahead of a waiting one without: the rest are delayed, never starved.
const maxPriorityStreak = 8

// writeGate hands out the one write connection: in order of arrival, but the
// writes with priority first. database/sql's pool of one connection hands it
// to a random waiter, and a site agent's session, one writer among a thousand
// machines' sessions, waited for it at every event.
type writeGate struct {
	mu     sync.Mutex
	busy   bool
	first  []chan struct{} // waiting with priority
	rest   []chan struct{}
	streak int // grants to first in a row while rest waited
}

// acquire waits for the write connection; release hands it on.
func (g *writeGate) acquire(ctx context.Context) error {
	g.mu.Lock()
	if !g.busy {
		g.busy = true
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	prio := store.HasPriority(ctx)
	if prio {
		g.first = append(g.first, ch)
	} else {
		g.rest = append(g.rest, ch)
	}
	g.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	q := &g.rest
	if prio {
		q = &g.first
	}
	if i := slices.Index(*q, ch); i >= 0 {
		*q = slices.Delete(*q, i, i+1)
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	// Granted as ctx ended: hand it on.
	g.release()
	return ctx.Err()
}

func (g *writeGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	var next chan struct{}
	switch {
	case len(g.first) > 0 && (len(g.rest) == 0 || g.streak < maxPriorityStreak):
		next, g.first = g.first[0], g.first[1:]
		if len(g.rest) > 0 {
			g.streak++
		}
	case len(g.rest) > 0:
		next, g.rest = g.rest[0], g.rest[1:]
		g.streak = 0
	default:
		g.busy = false
		return
	}
	close(next) // the connection passes on: busy stays set
}

// waiting is how many wait, for tests.
func (g *writeGate) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.first) + len(g.rest)
}
