// Package retention runs the control plane's pruner: every Interval it deletes
// what the operator's store.Retention does not keep (serve --events-per-kind,
// --events-max-age, --events-max-total), in batches, each its own short write
// transaction, so that a flood of boot nonces (every script GET of a site's
// boot server mints one, and nothing authenticates that client) leaves the
// database within the bound instead of growing it for as long as it lasts.
package retention

import (
	"context"
	"log/slog"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
)

// Defaults of a Pruner.
const (
	// DefaultInterval is how often a round runs. A storm of a thousand boot
	// nonces a second adds 60,000 rows a table between two rounds: the bound is
	// exceeded by at most that, for at most that long.
	DefaultInterval = time.Minute
	// DefaultBatch bounds the rows one transaction deletes: a few milliseconds
	// of the write lock, so that the ingest never waits long behind it.
	DefaultBatch = 1000
)

// Pruner deletes what Policy does not keep.
type Pruner struct {
	Store  store.Pruner
	Policy store.Retention
	// Interval between rounds; 0 means DefaultInterval.
	Interval time.Duration
	// Batch bounds the rows one transaction deletes; 0 means DefaultBatch.
	Batch int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

func (p *Pruner) log() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Round prunes until nothing is left to prune (the store is then within
// Policy) or ctx ends, and returns what it deleted.
func (p *Pruner) Round(ctx context.Context) (store.Pruned, error) {
	batch := p.Batch
	if batch <= 0 {
		batch = DefaultBatch
	}
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	var total store.Pruned
	for ctx.Err() == nil {
		got, err := p.Store.Prune(ctx, p.Policy, now(), batch)
		total = total.Add(got)
		if err != nil {
			return total, err
		}
		if got.Total() == 0 {
			return total, nil
		}
	}
	return total, ctx.Err()
}

// Run runs a round at once and then every Interval until ctx ends. A round
// that fails is logged and the next one tries again.
func (p *Pruner) Run(ctx context.Context) {
	every := p.Interval
	if every <= 0 {
		every = DefaultInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		got, err := p.Round(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			p.log().Error("retention: pruning failed; trying again at the next round", "err", err)
		case got.Total() > 0:
			p.log().Info("retention: pruned", "events", got.Events, "machine_events", got.MachineEvents,
				"boot_nonces", got.BootNonces)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
