package store

import (
	"context"
	"time"
)

// Defaults of a Retention, which serve's flags start from.
const (
	// DefaultPerKind is how many of the latest events of one kind a node, and
	// a machine's timeline, keep (serve --events-per-kind).
	DefaultPerKind = 1000
	// DefaultMaxAge is how long an event is kept at most (serve --events-max-age).
	DefaultMaxAge = 90 * 24 * time.Hour
	// DefaultMaxTotal bounds the rows of each of events, machine_events and
	// boot_nonces (serve --events-max-total).
	DefaultMaxTotal = 1_000_000
	// DefaultNoncesPerMAC is how many of the latest boot nonces of one MAC
	// are kept: the newest is the one a booting ramdisk presents, a few
	// before it cover a script fetched twice.
	DefaultNoncesPerMAC = 16
)

// Retention bounds what agents' reports leave in the store. Every script GET
// of a site's boot server mints a boot nonce (a boot_nonces row, a node event
// and a timeline entry), and an unauthenticated client can ask for as many as
// it likes; nothing else would ever delete them. A zero field leaves that bound
// off.
type Retention struct {
	// PerKind keeps, of each node's events of one kind and of each
	// machine's timeline entries of one kind, the latest PerKind and the
	// first, so that a storm leaves its start and its end on the timeline.
	PerKind int
	// MaxAge deletes events, timeline entries and boot nonces older than it,
	// whatever the counts.
	MaxAge time.Duration
	// MaxTotal bounds the rows of each of the three tables; the oldest go
	// first.
	MaxTotal int
	// NoncesPerMAC keeps the latest NoncesPerMAC boot nonces of a MAC (and
	// any a waiting join holds).
	NoncesPerMAC int
}

// DefaultRetention is serve's retention without flags.
func DefaultRetention() Retention {
	return Retention{PerKind: DefaultPerKind, MaxAge: DefaultMaxAge, MaxTotal: DefaultMaxTotal, NoncesPerMAC: DefaultNoncesPerMAC}
}

// Pruned counts the rows one Prune deleted.
type Pruned struct {
	Events, MachineEvents, BootNonces int
}

// Total is the rows deleted.
func (p Pruned) Total() int { return p.Events + p.MachineEvents + p.BootNonces }

// Add sums two counts.
func (p Pruned) Add(q Pruned) Pruned {
	return Pruned{p.Events + q.Events, p.MachineEvents + q.MachineEvents, p.BootNonces + q.BootNonces}
}

// Pruner applies a Retention.
type Pruner interface {
	// Prune deletes, in transactions of at most batch rows each (the write
	// lock is never held longer than one takes), some of what r does not
	// keep at now, and reports how much. It is called again until it
	// deletes nothing: a round leaves the store within r only then.
	Prune(ctx context.Context, r Retention, now time.Time, batch int) (Pruned, error)
}
