package agent

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is a jittered exponential backoff: attempt n waits a random time between
// half and all of min(Initial·2ⁿ, Max). The jitter spreads a fleet that lost its
// gateway at the same moment, so it does not come back at the same moment too.
type Backoff struct {
	// Initial is the first delay; 0 means one second.
	Initial time.Duration
	// Max bounds every delay; 0 means one minute.
	Max time.Duration
}

// Delay returns the wait before retry number attempt (0 for the first retry).
func (b Backoff) Delay(attempt int) time.Duration {
	initial, max := b.Initial, b.Max
	if initial <= 0 {
		initial = time.Second
	}
	if max <= 0 {
		max = time.Minute
	}
	if max < initial {
		max = initial
	}
	d := initial
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}

// Sleep waits d or until ctx is done, and reports whether the full time passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
