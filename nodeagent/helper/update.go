package helper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/better-compute/bcd/agent/daemonupdate"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/version"
	"github.com/better-compute/bcd/protocol"
)

// UpdateClient is daemonupdate.Privileged on an unprivileged node: the slots
// and records are root's, so bcd helper verifies, swaps, confirms and swaps
// back under its own [update] pins and floor, while the node downloads the
// release into <data_dir>/staging itself (the staged file must be the node's)
// and execs the entrypoint, which links to root's slot, after a swap.
type UpdateClient struct {
	c       *Client
	running string
	// local is a Manager used only for Stage and Exec: its records
	// directory is the helper's, and it never touches it.
	local *selfupdate.Manager
}

var _ daemonupdate.Privileged = (*UpdateClient)(nil)

// NewUpdateClient is the helper's half of self-update for a node running
// version running, staging and exec'ing with local.
func NewUpdateClient(c *Client, running string, local *selfupdate.Manager) *UpdateClient {
	return &UpdateClient{c: c, running: running, local: local}
}

// NewUpdater is the updater bcd node runs beside bcd helper: daemonupdate's
// options for the node (its download client, fakehw test durations), with
// no systemd units and no root check, since the helper does both; each edit
// changes them first (tests). An updater that cannot be made refuses every
// release with the reason.
func NewUpdater(cfg *config.Config, configPath string, c *Client, log *slog.Logger, edit ...func(*selfupdate.Options)) *daemonupdate.Updater {
	o, err := daemonupdate.OptionsFor(cfg, configPath, log)
	if err == nil {
		for _, e := range edit {
			if e != nil {
				e(&o)
			}
		}
		// Set after the edits: the node writes no systemd unit and adopts
		// nothing; bcd helper does, as root.
		o.Systemd, o.RequireRoot = false, false
	}
	var m *selfupdate.Manager
	if err == nil {
		m, err = selfupdate.New(o)
	}
	if err != nil {
		return daemonupdate.Disabled(fmt.Errorf("self-update through bcd helper: %w", err), version.Version, log)
	}
	return daemonupdate.NewWith(NewUpdateClient(c, o.Running, m), o.Running, log)
}

func background() (context.Context, context.CancelFunc) {
	// Resume, Confirm and SwapBack have no context in Privileged; the
	// client's own timeout bounds each call.
	return context.WithCancel(context.Background())
}

// Resume is update.resume for the running version.
func (u *UpdateClient) Resume() (selfupdate.Outcome, error) {
	ctx, cancel := background()
	defer cancel()
	return u.c.UpdateResume(ctx, u.running)
}

// Prepare has the helper verify sec (update.verify) and, for a release to
// take, downloads it into <data_dir>/staging as the node. A nil Plan: sec
// names the running version.
func (u *UpdateClient) Prepare(ctx context.Context, sec protocol.DaemonSection, serverNow time.Time) (*selfupdate.Plan, error) {
	p, err := u.c.UpdateVerify(ctx, u.running, sec, serverNow)
	if err != nil || p == nil {
		return nil, err
	}
	// The wire leaves them out (json:"-"); update.swap sends them again for
	// the helper to verify once more.
	p.Section, p.ServerNow = sec, serverNow
	if err := u.local.Stage(ctx, p); err != nil {
		return nil, err
	}
	return p, nil
}

// Swap is update.swap: the helper verifies p's section again, installs the
// staged binary into its slots directory and swaps.
func (u *UpdateClient) Swap(ctx context.Context, p *selfupdate.Plan, commandID string, revision int64) error {
	if p == nil {
		return errors.New("self-update through bcd helper: swap: no plan")
	}
	return u.c.UpdateSwap(ctx, u.running, p.Section, p.ServerNow, commandID, revision)
}

// Confirm is update.confirm for the running version (the first Welcome).
func (u *UpdateClient) Confirm() (selfupdate.Outcome, error) {
	ctx, cancel := background()
	defer cancel()
	return u.c.UpdateConfirm(ctx, u.running)
}

// SwapBack is update.swap-back.
func (u *UpdateClient) SwapBack(why string) error {
	ctx, cancel := background()
	defer cancel()
	return u.c.UpdateSwapBack(ctx, u.running, why)
}

// Exec replaces this process with the entrypoint, which links to the slot
// the helper swapped to.
func (u *UpdateClient) Exec() error { return u.local.Exec() }
