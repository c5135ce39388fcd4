package selfupdate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Product is the product a bcd release manifest must name.
const Product = "bcd"

// Plan is a verified update, ready for Stage and Swap. It crosses bcd
// helper's socket (Verify runs in the helper, Stage in the unprivileged
// node), so its fields are exported; the helper never takes a Plan from the
// node: its swap verifies the section again under its own pins and floor.
type Plan struct {
	// Version is the release to swap to.
	Version string `json:"version"`
	// Sequence is its manifest sequence.
	Sequence int64 `json:"sequence"`
	// FromSlot is set when the other slot already holds the release
	// (step 5): nothing is downloaded.
	FromSlot string `json:"from_slot,omitempty"`
	// Staged, Size and SHA256 are the staged binary's file name in
	// <data_dir>/staging and its size and digest as the manifest lists them.
	Staged string `json:"staged,omitempty"`
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
	// URL is where Stage downloads it from (https only).
	URL string `json:"url,omitempty"`

	// Section and ServerNow are what Verify checked, for a swap through the
	// helper, which verifies them again. Never sent.
	Section   protocol.DaemonSection `json:"-"`
	ServerNow time.Time              `json:"-"`
}

// Prepare verifies sec (step 1) and downloads its binary into staging
// (step 2), or finds it in the other slot (step 5). It returns a nil Plan and
// nil error when sec names the running version: nothing to do. Every reason
// not to take the release is a *Refusal; nothing on the host changes but the
// staging file. serverNow is the server's clock (the Welcome's server_time);
// zero checks the expiry on the host clock only. Prepare does not hold the
// host's update lock (a download may take minutes, and bcd update --rollback
// must not wait on it); Swap checks the records again under the lock.
func (m *Manager) Prepare(ctx context.Context, sec protocol.DaemonSection, serverNow time.Time) (*Plan, error) {
	p, err := m.Verify(sec, serverNow)
	if err != nil || p == nil {
		return nil, err
	}
	if err := m.Stage(ctx, p); err != nil {
		return nil, err
	}
	return p, nil
}

// Verify is Prepare without the download: step 1 on sec under this
// Manager's pins and floor, and step 5's look at the other slot. A nil Plan
// and nil error: sec names the running version. It changes nothing on the
// host. bcd helper runs it for an unprivileged node, which then Stages.
func (m *Manager) Verify(sec protocol.DaemonSection, serverNow time.Time) (*Plan, error) {
	p, err := m.verifyPlan(sec, serverNow)
	if p != nil {
		p.Section, p.ServerNow = sec, serverNow
	}
	return p, err
}

// Stage downloads a verified Plan's binary into <data_dir>/staging (step 2);
// a Plan from the other slot needs nothing.
func (m *Manager) Stage(ctx context.Context, p *Plan) error {
	if p == nil {
		return errors.New("selfupdate: stage: no plan")
	}
	if p.FromSlot != "" {
		return nil
	}
	if p.Staged != StagedName(p.Version) || p.Size <= 0 || !hexSHA256.MatchString(p.SHA256) {
		return errors.New("selfupdate: stage: the plan names no verified binary")
	}
	if err := m.download(ctx, p.URL, p); err != nil {
		return err
	}
	m.log.Info("self-update: staged a verified release", "version", p.Version, "sequence", p.Sequence, "size", p.Size)
	return nil
}

// StagedName is the staged binary's file name in <data_dir>/staging.
func StagedName(version string) string { return "bcd-" + strings.TrimPrefix(version, "v") }

func (m *Manager) verifyPlan(sec protocol.DaemonSection, serverNow time.Time) (*Plan, error) {
	if len(m.o.Pins) == 0 {
		return nil, refuse(CodeNoReleasePins, "[update] release_pins is empty: bcd takes no binary without pinned release keys")
	}
	if !pki.ValidReleaseVersion(sec.Version) {
		return nil, refuse(CodeSectionInvalid, "the daemon section's version %q is not a semantic version", human.ShortN(sec.Version, 80))
	}
	if pki.SameVersion(sec.Version, m.o.Running) {
		return nil, nil
	}
	update, err := m.readUpdate()
	if err != nil {
		return nil, err
	}
	if f, ok := failedBefore(update, sec.Version); ok {
		return nil, refuse(CodeFailedBefore, "bcd %s failed on this host at %s (%s); bcd update --clear-failed allows it again",
			sec.Version, f.At.UTC().Format(time.RFC3339), f.Reason)
	}
	floor := m.floor(update)
	if p, err := m.fromOtherSlot(sec, floor); p != nil || err != nil {
		return p, err
	}
	if sec.Signature == "" {
		return nil, refuse(pki.ErrReleaseUntrusted.Error(), "the daemon section for bcd %s carries no signed manifest", sec.Version)
	}
	if !hexSHA256.MatchString(sec.SHA256) {
		return nil, refuse(CodeSectionInvalid, "the daemon section's sha256 is not 64 lowercase hex digits")
	}
	art, seq, err := m.verify(sec, floor, serverNow)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(sec.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, refuse(CodeInsecureURL, "the download URL %q is not https://", human.ShortN(sec.URL, 200))
	}
	if art.Size > m.o.MaxSize {
		return nil, refuse(CodeTooLarge, "%s is %d bytes, more than the %d-byte limit", art.Name, art.Size, m.o.MaxSize)
	}
	return &Plan{Version: strings.TrimPrefix(sec.Version, "v"), Sequence: seq, Size: art.Size, SHA256: art.SHA256,
		Staged: StagedName(sec.Version), URL: sec.URL}, nil
}

// fromOtherSlot is step 5: the other slot's binary is taken without a
// manifest only when slots.json records it as sec.Version with a known
// sequence not below the floor. Below the floor it is refused outright, even
// with a manifest, since that manifest is below the floor too.
func (m *Manager) fromOtherSlot(sec protocol.DaemonSection, floor int64) (*Plan, error) {
	current, err := m.linkedSlot(CurrentLink)
	if err != nil || current == "" {
		return nil, err
	}
	slots, err := m.readSlots()
	if err != nil {
		return nil, err
	}
	other, ok := slots.Slots[otherSlot(current)]
	if !ok || !pki.SameVersion(other.Version, sec.Version) {
		return nil, nil
	}
	switch {
	case other.Sequence > 0 && other.Sequence >= floor:
		return &Plan{Version: strings.TrimPrefix(sec.Version, "v"), Sequence: other.Sequence, FromSlot: otherSlot(current)}, nil
	case other.Sequence > 0:
		return nil, &Refusal{Code: pki.ErrReleaseRollback.Error(), Err: pki.ErrReleaseRollback, Message: fmt.Sprintf(
			"bcd %s in slot %s has sequence %d, below the release floor %d", sec.Version, SlotFile(otherSlot(current)), other.Sequence, floor)}
	}
	// The sequence is unknown: only a verified manifest will do.
	return nil, nil
}

// verify is step 1 on the manifest; it returns the binary's artifact and
// the release's sequence.
func (m *Manager) verify(sec protocol.DaemonSection, floor int64, serverNow time.Time) (pki.Artifact, int64, error) {
	policy := pki.ReleasePolicy{
		Pins: m.o.Pins, Threshold: m.o.Threshold, Product: Product,
		Version: sec.Version, MinSequence: floor, Now: m.now(),
	}
	r, err := pki.VerifyRelease([]byte(sec.Signature), policy)
	if err != nil {
		return pki.Artifact{}, 0, releaseRefusal(err, " (host clock)")
	}
	if !serverNow.IsZero() {
		policy.Now = serverNow
		if err := r.Check(policy); err != nil {
			return pki.Artifact{}, 0, releaseRefusal(err, " (server time)")
		}
	}
	name := pki.BinaryName(Product, sec.Version, runtime.GOOS, runtime.GOARCH)
	art, ok := r.Artifact(name)
	if !ok {
		return pki.Artifact{}, 0, &Refusal{Code: pki.ErrReleaseIncomplete.Error(), Err: pki.ErrReleaseIncomplete,
			Message: fmt.Sprintf("the manifest of bcd %s does not list %s", r.Version, name)}
	}
	if art.SHA256 != sec.SHA256 {
		return pki.Artifact{}, 0, &Refusal{Code: pki.ErrReleaseMismatch.Error(), Err: pki.ErrReleaseMismatch,
			Message: fmt.Sprintf("the manifest lists %s with sha256 %s, the daemon section says %s", name, art.SHA256, sec.SHA256)}
	}
	return art, r.Sequence, nil
}

// errIdle is the watchdog's cause: no byte for IdleTimeout.
var errIdle = errors.New("no data")

// download streams the binary into DataDir/staging/bcd-<version>, checking
// the manifest's size and digest as it goes, under an idle watchdog. The
// bytes go to a temporary file renamed into place only once they check out,
// so a refused download leaves nothing behind.
func (m *Manager) download(ctx context.Context, rawURL string, p *Plan) error {
	dir, err := m.stagingDir()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	idle := m.o.IdleTimeout
	watchdog := time.AfterFunc(idle, func() { cancel(errIdle) })
	defer watchdog.Stop()
	fail := func(err error) error {
		if err == nil {
			err = context.Cause(ctx)
		}
		if errors.Is(context.Cause(ctx), errIdle) {
			return refuse(CodeDownloadFailed, "%s: no data for %s", human.ShortN(rawURL, 200), idle)
		}
		return refuse(CodeDownloadFailed, "%s: %v", human.ShortN(rawURL, 200), err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		return refuse(CodeDownloadFailed, "%v", err)
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return refuse(CodeDownloadFailed, "%s: HTTP %s", human.ShortN(rawURL, 200), resp.Status)
	}
	if resp.ContentLength >= 0 && resp.ContentLength != p.Size {
		return refuse(CodeSizeMismatch, "%s: Content-Length %d, the manifest says %d bytes", human.ShortN(rawURL, 200), resp.ContentLength, p.Size)
	}
	body := &idleReader{r: resp.Body, watchdog: watchdog, idle: idle}
	c, err := copyToTemp(dir, p.Staged, body, p.Size)
	// A body cut off by the watchdog may read as a short one: the cause
	// says which it was.
	if err != nil || context.Cause(ctx) != nil {
		if c != nil {
			c.abort()
		}
		return fail(err)
	}
	switch {
	case c.n > p.Size:
		c.abort()
		return refuse(CodeSizeMismatch, "%s: more than the manifest's %d bytes", human.ShortN(rawURL, 200), p.Size)
	case c.n < p.Size:
		c.abort()
		return refuse(CodeSizeMismatch, "%s: %d bytes, the manifest says %d", human.ShortN(rawURL, 200), c.n, p.Size)
	case c.sha256 != p.SHA256:
		c.abort()
		return refuse(CodeDigestMismatch, "%s: sha256 %s, the manifest says %s", human.ShortN(rawURL, 200), c.sha256, p.SHA256)
	}
	// The staged file is read back only by Swap, as root or by the helper:
	// 0600 in the 0700 staging directory.
	return c.commit(p.Staged, 0o600)
}

// idleReader restarts the watchdog whenever bytes arrive.
type idleReader struct {
	r        io.Reader
	watchdog *time.Timer
	idle     time.Duration
}

func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.watchdog.Reset(r.idle)
	}
	return n, err
}

// stagingDir makes DataDir/staging (0700) and refuses one that is a symlink.
func (m *Manager) stagingDir() (string, error) {
	dir := filepath.Join(m.o.DataDir, StagingDir)
	if err := os.Mkdir(dir, stagingMode); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("selfupdate: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("selfupdate: %w", err)
	}
	if !fi.IsDir() {
		return "", refuse(CodeStagingRefused, "the staging directory %s is not a directory (%s)", dir, fi.Mode().Type())
	}
	if fi.Mode().Perm() != stagingMode {
		if err := os.Chmod(dir, stagingMode); err != nil {
			return "", fmt.Errorf("selfupdate: %w", err)
		}
	}
	return dir, nil
}
