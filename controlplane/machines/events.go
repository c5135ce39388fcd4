package machines

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// MaxClockSkew is how far a site agent's clock may run ahead of the control
// plane's before a nonce's expiry counts as too far ahead.
const MaxClockSkew = time.Minute

// EventStore is what Events writes.
type EventStore interface {
	RecordBoot(ctx context.Context, site, mac, stage string, ev store.MachineEvent) (string, error)
	RecordBoots(ctx context.Context, site string, steps []store.BootStep) ([]string, error)
	AddBootNonces(ctx context.Context, site string, ns []store.BootNonce) ([]bool, error)
	AddMachineEvent(ctx context.Context, e store.MachineEvent) error
	FindMachineByMAC(ctx context.Context, mac string) (store.Machine, error)
}

// Events makes machine records of what site agents report.
type Events struct {
	// Store holds machines and nonces.
	Store EventStore
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

func (e *Events) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

func (e *Events) log() *slog.Logger {
	if e.Logger != nil {
		return e.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Event handles an event of node and returns it as it may be stored: a
// boot.nonce's nonce replaced by its SHA-256. An error is the store
// failing: the event is then not acknowledged, and the agent replays it
// (handling one twice changes nothing).
func (e *Events) Event(ctx context.Context, node store.Node, ev protocol.Event) (protocol.Event, error) {
	if node.Role != protocol.RoleSite {
		return ev, nil
	}
	switch ev.Kind {
	case protocol.EventMachineBooted:
		return ev, e.booted(ctx, node, ev)
	case protocol.EventBootNonce:
		return e.nonce(ctx, node, ev)
	case protocol.EventBootRefused:
		return ev, e.bootRefused(ctx, node, ev)
	}
	return ev, nil
}

// bootRefused puts a site agent's refusal of a nonce or witness on the
// timeline of the machine whose MAC was claimed: someone on the VLAN may be
// spoofing it. A replayed event adds a second entry; that is all it costs.
func (e *Events) bootRefused(ctx context.Context, node store.Node, ev protocol.Event) error {
	var b protocol.BootRefused
	if err := json.Unmarshal(ev.Data, &b); err != nil {
		e.log().Warn("boot.refused: ignoring malformed data", "node", node.ID, "err", err)
		return nil
	}
	mac, err := protocol.NormalizeMAC(b.MAC)
	if err != nil {
		return nil
	}
	m, err := e.Store.FindMachineByMAC(ctx, mac)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return err
	case m.Site != node.Site:
		return nil
	}
	e.log().Warn("boot.refused: the site agent refused a client claiming a machine (spoofing?)", "node", node.ID, "machine", m.ID,
		"mac", mac, "ip", human.Short(b.IP), "neighbor_mac", human.Short(b.NeighborMAC), "count", b.Count)
	data, _ := json.Marshal(b)
	msg := fmt.Sprintf("site agent %s refused %s (claiming %s): %s", node.ID, human.Short(b.IP), mac, human.Short(b.Reason))
	if b.Count > 1 {
		msg += fmt.Sprintf(" (×%d)", b.Count)
	}
	return e.Store.AddMachineEvent(ctx, store.MachineEvent{MachineID: m.ID, Time: e.now(), Kind: protocol.EventBootRefused,
		Message: msg, NodeID: node.ID, Data: data})
}

// Events is Event for a batch of node's events, in order. A run of boot steps
// is recorded in one transaction (RecordBoots), and so is a run of boot nonces
// (AddBootNonces): a flood of script GETs costs a commit per batch, not one per
// nonce. A run ends where an event of another kind comes, so that the timeline
// entries keep the order of the events.
func (e *Events) Events(ctx context.Context, node store.Node, evs []protocol.Event) ([]protocol.Event, error) {
	out := append([]protocol.Event(nil), evs...)
	if node.Role != protocol.RoleSite {
		return out, nil
	}
	var steps []store.BootStep
	var nonces []store.BootNonce
	record := func() error {
		if len(nonces) > 0 {
			if _, err := e.Store.AddBootNonces(ctx, node.Site, nonces); err != nil {
				return err
			}
			nonces = nonces[:0]
		}
		if len(steps) == 0 {
			return nil
		}
		ids, err := e.Store.RecordBoots(ctx, node.Site, steps)
		if err != nil {
			return err
		}
		for i, id := range ids {
			e.logBoot(node, steps[i], id)
		}
		steps = steps[:0]
		return nil
	}
	for i, ev := range out {
		switch ev.Kind {
		case protocol.EventMachineBooted:
			if len(nonces) > 0 {
				if err := record(); err != nil {
					return nil, err
				}
			}
			if st, ok := e.bootStep(node, ev); ok {
				steps = append(steps, st)
			}
			continue
		case protocol.EventBootNonce:
			if len(steps) > 0 {
				if err := record(); err != nil {
					return nil, err
				}
			}
			var n store.BootNonce
			var ok bool
			if out[i], n, ok = e.nonceRecord(node, ev); ok {
				nonces = append(nonces, n)
			}
			continue
		}
		// What is neither keeps its place after the runs before it.
		if err := record(); err != nil {
			return nil, err
		}
		got, err := e.Event(ctx, node, ev)
		if err != nil {
			return nil, err
		}
		out[i] = got
	}
	if err := record(); err != nil {
		return nil, err
	}
	return out, nil
}

func (e *Events) booted(ctx context.Context, node store.Node, ev protocol.Event) error {
	st, ok := e.bootStep(node, ev)
	if !ok {
		return nil
	}
	id, err := e.Store.RecordBoot(ctx, node.Site, st.MAC, st.Stage, st.Event)
	if errors.Is(err, store.ErrNotFound) {
		id, err = "", nil
	}
	if err == nil {
		e.logBoot(node, st, id)
	}
	return err
}

// bootStep reads a machine.booted event; false for one that is malformed, after a
// warning.
func (e *Events) bootStep(node store.Node, ev protocol.Event) (store.BootStep, bool) {
	var b protocol.MachineBooted
	if err := json.Unmarshal(ev.Data, &b); err != nil {
		e.log().Warn("machine.booted: ignoring malformed data", "node", node.ID, "err", err)
		return store.BootStep{}, false
	}
	mac, err := protocol.NormalizeMAC(b.MAC)
	if err != nil || !validStage(b.Stage) {
		e.log().Warn("machine.booted: ignoring an event without a MAC and stage", "node", node.ID, "mac", human.Short(b.MAC), "stage", human.Short(b.Stage))
		return store.BootStep{}, false
	}
	at := b.Time
	if at.IsZero() {
		at = ev.Time
	}
	msg := "stage " + b.Stage
	if b.Count > 1 {
		msg += " ×" + strconv.Itoa(b.Count) // a coalesced burst
	}
	if b.File != "" {
		msg += ": served " + human.Short(b.File)
	}
	if b.IP != "" {
		msg += " to " + human.Short(b.IP)
	}
	msg += " (" + mac + ")"
	return store.BootStep{MAC: mac, Stage: b.Stage, Event: store.MachineEvent{Time: at, Kind: protocol.EventMachineBooted,
		Message: msg, NodeID: node.ID, Data: ev.Data}}, true
}

// logBoot logs a recorded boot step; id is "" when no machine of the site has the MAC.
func (e *Events) logBoot(node store.Node, st store.BootStep, id string) {
	if id == "" {
		e.log().Debug("machine.booted for a MAC that is no machine of the site", "node", node.ID, "site", node.Site, "mac", st.MAC)
		return
	}
	e.log().Info("machine booted", "machine", id, "mac", st.MAC, "stage", st.Stage, "site", node.Site)
}

func validStage(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// StoredNonce is what a boot.nonce event's data becomes in the store.
type StoredNonce struct {
	MAC         string    `json:"mac"`
	NonceSHA256 string    `json:"nonce_sha256"`
	ExpiresAt   time.Time `json:"expires_at"`
}

func (e *Events) nonce(ctx context.Context, node store.Node, ev protocol.Event) (protocol.Event, error) {
	ev, n, ok := e.nonceRecord(node, ev)
	if !ok {
		return ev, nil
	}
	_, err := e.Store.AddBootNonces(ctx, node.Site, []store.BootNonce{n})
	return ev, err
}

// nonceRecord reads a boot.nonce event of node: the event as it may be stored
// and, unless the nonce is refused (false, after a warning), the nonce to store
// with its timeline entry (AddBootNonces keeps the entry only when a machine of
// the site has the MAC, and fills in its id).
func (e *Events) nonceRecord(node store.Node, ev protocol.Event) (protocol.Event, store.BootNonce, bool) {
	var b protocol.BootNonce
	err := json.Unmarshal(ev.Data, &b)
	// Whatever the data and message were, the stored event carries neither:
	// they may hold the nonce.
	ev.Data, ev.Message = nil, ""
	if err != nil {
		e.log().Warn("boot.nonce: ignoring malformed data", "node", node.ID, "err", err)
		return ev, store.BootNonce{}, false
	}
	now := e.now()
	mac, macErr := protocol.NormalizeMAC(b.MAC)
	var why string
	switch {
	case macErr != nil:
		why = "no valid MAC"
	case !protocol.ValidBootNonce(b.Nonce):
		why = "not a valid nonce"
	case !now.Before(b.ExpiresAt):
		why = "already expired"
	case b.ExpiresAt.After(now.Add(protocol.MaxBootNonceLifetime + MaxClockSkew)):
		why = fmt.Sprintf("expires %s ahead, more than %s", b.ExpiresAt.Sub(now).Round(time.Second), protocol.MaxBootNonceLifetime)
	}
	if why != "" {
		e.log().Warn("boot.nonce refused", "node", node.ID, "mac", human.Short(b.MAC), "reason", why)
		ev.Message = "refused: " + why
		return ev, store.BootNonce{}, false
	}
	h := token.Hash(sha256.Sum256([]byte(b.Nonce)))
	stored := StoredNonce{MAC: mac, NonceSHA256: hex.EncodeToString(h[:]), ExpiresAt: b.ExpiresAt.UTC()}
	ev.Data, _ = json.Marshal(stored)
	ev.Message = "boot nonce for " + mac

	// In the nonce's own transaction: added apart, a gateway stopped between
	// the two left the nonce without its timeline entry, and the replayed
	// event found the nonce and added nothing.
	data, _ := json.Marshal(map[string]any{"mac": mac, "expires_at": stored.ExpiresAt, "ip": b.IP, "interface": b.Interface})
	n := store.BootNonce{Hash: h, MAC: mac, Site: node.Site, SiteNode: node.ID, CreatedAt: now, ExpiresAt: b.ExpiresAt,
		Event: &store.MachineEvent{Time: now, Kind: protocol.EventBootNonce,
			Message: fmt.Sprintf("boot nonce minted for %s, valid until %s", mac, stored.ExpiresAt.Format(time.RFC3339)),
			NodeID:  node.ID, Data: data}}
	return ev, n, true
}
