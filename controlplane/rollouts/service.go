package rollouts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/refusal"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Product is the product a release must be for.
const Product = "bcd"

// Arches are the platforms whose bare binaries a release may list.
var Arches = []string{"amd64", "arm64"}

// Defaults of a rollout's settings.
var DefaultWaves = []int{1, 10, 50, 100}

const (
	DefaultMaxUnavailable   = 1
	DefaultFailureThreshold = 10
	DefaultWaveTimeout      = 30 * time.Minute
	// MinWaveTimeout keeps a typo (30s for 30m) from failing every node.
	MinWaveTimeout = 10 * time.Second
)

// Reasons of a failed rollout node besides the agents' own.
const (
	ReasonWaveTimeout       = "WaveTimeout"
	ReasonNodeDeleted       = "NodeDeleted"
	ReasonArchUnknown       = "ArchUnknown"
	ReasonReleaseIncomplete = "ReleaseIncomplete"
)

// ServiceStore is what the Service reads and writes.
type ServiceStore interface {
	store.Releases
	store.Rollouts
	GetNode(ctx context.Context, id string) (store.Node, error)
	ListNodes(ctx context.Context) ([]store.Node, error)
	CreateCommand(ctx context.Context, c store.Command) error
}

// Notifier reaches node sessions: the gateway.
type Notifier interface {
	// Notify: the node has a new command.
	Notify(nodeID string)
	// NodeSpecChanged: the node's own part of its spec changed (its
	// daemon target).
	NodeSpecChanged(nodeID string)
}

// Service is what the api asks of releases and rollouts. Its refusals are
// *refusal.Refusal errors.
type Service struct {
	Store ServiceStore
	// ReleasePins and ReleaseThreshold are the operator's release pins
	// (serve --release-pins, --release-threshold): AddRelease verifies every
	// manifest under them and refuses without them.
	ReleasePins      []string
	ReleaseThreshold int
	// Notifier; nil leaves commands to the node's next session.
	Notifier Notifier
	// Kick wakes the rollout controller; nil leaves it to its tick.
	Kick func()
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Service) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func (s *Service) kick() {
	if s.Kick != nil {
		s.Kick()
	}
}

// releaseRefusal is a pki release error as a refusal whose code is its
// RELEASE_* code.
func releaseRefusal(err error) error {
	for _, e := range []error{pki.ErrReleaseUntrusted, pki.ErrReleaseExpired, pki.ErrReleaseMismatch,
		pki.ErrReleaseIncomplete, pki.ErrReleaseRollback} {
		if errors.Is(err, e) {
			return refusal.New(e.Error(), "%s", strings.TrimPrefix(err.Error(), e.Error()+": "))
		}
	}
	return err
}

// CheckURLBase checks a releases URL base (https, a host, no query) and
// returns it without a trailing /.
func CheckURLBase(field, v string) (string, error) {
	u, err := url.Parse(v)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", refusal.New(protocol.CodeInvalidInput, "%s %q: want https://host[:port][/path]", field, human.ShortN(v, 120))
	}
	return strings.TrimSuffix(v, "/"), nil
}

// AddRelease verifies manifest under the operator's release pins and
// stores the release, its binaries served below urlBase. It reports
// whether the release was new: the same manifest again is not an error.
func (s *Service) AddRelease(ctx context.Context, manifest []byte, urlBase string) (store.Release, bool, error) {
	if len(s.ReleasePins) == 0 {
		return store.Release{}, false, refusal.New(protocol.CodeInvalidConfig,
			"serve has no --release-pins: releases add verifies every manifest under the operator's release pins")
	}
	base, err := CheckURLBase("url_base (--url-base)", urlBase)
	if err != nil {
		return store.Release{}, false, err
	}
	threshold := max(s.ReleaseThreshold, 1)
	rel, err := pki.VerifyRelease(manifest, pki.ReleasePolicy{Pins: s.ReleasePins, Threshold: threshold, Product: Product, Now: s.now()})
	if err != nil {
		return store.Release{}, false, releaseRefusal(err)
	}
	r := store.Release{Version: strings.TrimPrefix(rel.Version, "v"), Product: rel.Product, Sequence: rel.Sequence,
		Expires: rel.Expires, Manifest: string(manifest), URLBase: base, AddedAt: s.now()}
	for _, arch := range Arches {
		if a, ok := rel.Artifact(pki.BinaryName(Product, rel.Version, "linux", arch)); ok {
			r.Binaries = append(r.Binaries, store.ReleaseBinary{Arch: arch, Name: a.Name, Size: a.Size, SHA256: a.SHA256})
		}
	}
	if len(r.Binaries) == 0 {
		return store.Release{}, false, refusal.New(pki.ErrReleaseIncomplete.Error(), "release manifest for %s %s lists no bare binary %s or %s",
			Product, rel.Version, pki.BinaryName(Product, rel.Version, "linux", "amd64"), pki.BinaryName(Product, rel.Version, "linux", "arm64"))
	}
	out, added, err := s.Store.AddRelease(ctx, r)
	if errors.Is(err, store.ErrExists) {
		return store.Release{}, false, refusal.New(protocol.CodeAlreadyExists, "release %s was added with another manifest", r.Version)
	}
	if err != nil {
		return store.Release{}, false, err
	}
	if added {
		s.log().Info("release added", "version", out.Version, "sequence", out.Sequence, "expires", out.Expires, "url_base", out.URLBase)
	}
	return out, added, nil
}

// Release returns a stored release that has not expired, or a refusal
// that names the version.
func (s *Service) Release(ctx context.Context, version string) (store.Release, error) {
	return s.release(ctx, version)
}

// release returns a stored release that has not expired.
func (s *Service) release(ctx context.Context, version string) (store.Release, error) {
	rel, err := s.Store.GetRelease(ctx, version)
	if errors.Is(err, store.ErrNotFound) {
		return rel, refusal.New(protocol.CodeNotFound, "release %s is not added (better-compute releases add manifest.json)", human.ShortN(version, 80))
	}
	if err != nil {
		return rel, err
	}
	if now := s.now(); !now.Before(rel.Expires) {
		return rel, refusal.New(pki.ErrReleaseExpired.Error(), "release %s expired at %s; sign a new release", rel.Version,
			rel.Expires.UTC().Format(time.RFC3339))
	}
	return rel, nil
}

// NewRollout is what an operator asks of a rollout; zero values mean the
// defaults (FailureThreshold nil: DefaultFailureThreshold).
type NewRollout struct {
	Version          string
	Role, Pool, Site string
	Waves            []int
	MaxUnavailable   int
	FailureThreshold *int
	WaveTimeout      time.Duration
}

// CheckWaves checks cumulative wave percentages: 1 to 100, rising, the
// last 100.
func CheckWaves(waves []int) error {
	if len(waves) == 0 {
		return refusal.New(protocol.CodeInvalidInput, "waves (--waves): at least one wave, the last 100")
	}
	for i, w := range waves {
		if w < 1 || w > 100 || i > 0 && w <= waves[i-1] {
			return refusal.New(protocol.CodeInvalidInput, "waves (--waves) %s: want rising percentages from 1 to 100", joinInts(waves))
		}
	}
	if waves[len(waves)-1] != 100 {
		return refusal.New(protocol.CodeInvalidInput, "waves (--waves) %s: the last wave must be 100", joinInts(waves))
	}
	return nil
}

func joinInts(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ",")
}

// AssignWaves gives each of n nodes (in order) its wave, from 1: wave k
// ends at ceil(n*waves[k]/100) nodes, and at least one node after the
// wave before while nodes are left.
func AssignWaves(n int, waves []int) []int {
	out := make([]int, n)
	prev := 0
	for k, pct := range waves {
		end := min(n, max((n*pct+99)/100, prev+1))
		for i := prev; i < end; i++ {
			out[i] = k + 1
		}
		prev = end
	}
	return out
}

func anyOf(v string) string {
	if v == "" {
		return "any"
	}
	return v
}

// CreateRollout checks in and writes a new rollout, running.
func (s *Service) CreateRollout(ctx context.Context, in NewRollout) (store.Rollout, error) {
	if in.Role == "" {
		in.Role = protocol.RoleNode
	}
	if in.Role != protocol.RoleNode && in.Role != protocol.RoleSite {
		return store.Rollout{}, refusal.New(protocol.CodeInvalidInput, "role (--role) %q: want node or site", human.ShortN(in.Role, 80))
	}
	if in.Pool != "" {
		if err := ids.CheckName("pool (--pool)", in.Pool); err != nil {
			return store.Rollout{}, err
		}
	}
	if in.Site != "" {
		if err := ids.CheckName("site (--site)", in.Site); err != nil {
			return store.Rollout{}, err
		}
	}
	if in.Waves == nil {
		in.Waves = DefaultWaves
	}
	if err := CheckWaves(in.Waves); err != nil {
		return store.Rollout{}, err
	}
	switch {
	case in.MaxUnavailable < 0:
		return store.Rollout{}, refusal.New(protocol.CodeInvalidInput, "max_unavailable (--max-unavailable) %d: want 1 or more", in.MaxUnavailable)
	}
	threshold := DefaultFailureThreshold
	if in.FailureThreshold != nil {
		threshold = *in.FailureThreshold
	}
	if threshold < 0 || threshold > 100 {
		return store.Rollout{}, refusal.New(protocol.CodeInvalidInput, "failure_threshold (--failure-threshold) %d: want a percentage from 0 to 100", threshold)
	}
	switch {
	case in.WaveTimeout == 0:
		in.WaveTimeout = DefaultWaveTimeout
	case in.WaveTimeout < MinWaveTimeout:
		return store.Rollout{}, refusal.New(protocol.CodeInvalidInput, "wave_timeout (--wave-timeout) %s: want at least %s", in.WaveTimeout, MinWaveTimeout)
	}
	if in.Version == "" {
		return store.Rollout{}, refusal.New(protocol.CodeInvalidInput, "version (--version) is required")
	}
	rel, err := s.release(ctx, in.Version)
	if err != nil {
		return store.Rollout{}, err
	}
	nodes, err := s.Store.ListNodes(ctx)
	if err != nil {
		return store.Rollout{}, err
	}
	nodes = slices.DeleteFunc(nodes, func(n store.Node) bool {
		return n.Role != in.Role || in.Pool != "" && n.Pool != in.Pool || in.Site != "" && n.Site != in.Site
	})
	if len(nodes) == 0 {
		return store.Rollout{}, refusal.New(protocol.CodeNotFound, "no node of role %s in pool %s and site %s", in.Role, anyOf(in.Pool), anyOf(in.Site))
	}
	slices.SortFunc(nodes, func(a, b store.Node) int { return strings.Compare(a.ID, b.ID) })
	now := s.now()
	r := store.Rollout{ID: ids.New(ids.PrefixRollout, now), Version: rel.Version, Role: in.Role, Pool: in.Pool, Site: in.Site,
		Waves: in.Waves, MaxUnavailable: in.MaxUnavailable, FailureThreshold: threshold, WaveTimeout: in.WaveTimeout,
		State: store.RolloutRunning, Revision: 1, CreatedAt: now, UpdatedAt: now}
	for i, w := range AssignWaves(len(nodes), in.Waves) {
		r.Nodes = append(r.Nodes, store.RolloutNode{NodeID: nodes[i].ID, Pool: nodes[i].Pool, Wave: w, State: store.RolloutNodePending})
	}
	r.Timeline = []store.RolloutEvent{{At: now, Message: fmt.Sprintf(
		"created: bcd %s to %d node(s) (role %s, pool %s, site %s) in waves %s; max unavailable %d per pool, failure threshold %d%%, wave timeout %s",
		rel.Version, len(nodes), in.Role, anyOf(in.Pool), anyOf(in.Site), joinInts(in.Waves), in.MaxUnavailable, threshold, in.WaveTimeout)}}
	if err := s.Store.CreateRollout(ctx, r); err != nil {
		var active *store.ActiveRolloutError
		if errors.As(err, &active) {
			o := active.Rollout
			return store.Rollout{}, refusal.New(protocol.CodeAlreadyExists,
				"rollout %s of %s is %s for an overlapping set of nodes (role %s, pool %s, site %s): abort it or let it finish first",
				o.ID, o.Version, o.State, o.Role, anyOf(o.Pool), anyOf(o.Site))
		}
		return store.Rollout{}, err
	}
	s.log().Info("rollout created", "rollout", r.ID, "version", r.Version, "role", r.Role, "pool", r.Pool, "site", r.Site, "nodes", len(r.Nodes))
	s.kick()
	return s.Store.GetRollout(ctx, r.ID)
}

// Operator actions on a rollout.
const (
	ActionPause  = "pause"
	ActionResume = "resume"
	ActionAbort  = "abort"
)

// Act pauses, resumes or aborts a rollout. Asking for the state it is in
// already changes nothing.
func (s *Service) Act(ctx context.Context, id, action string) (store.Rollout, error) {
	for range 5 {
		r, err := s.Store.GetRollout(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return r, refusal.New(protocol.CodeNotFound, "rollout %s does not exist", human.ShortN(id, 80))
		}
		if err != nil {
			return r, err
		}
		var to, reason string
		switch {
		case action == ActionPause && r.State == store.RolloutRunning:
			to, reason = store.RolloutPaused, "paused by the operator"
		case action == ActionResume && r.State == store.RolloutPaused:
			to = store.RolloutRunning
		case action == ActionAbort && store.RolloutActive(r.State):
			to, reason = store.RolloutAborted, "aborted by the operator"
		case action == ActionPause && r.State == store.RolloutPaused, action == ActionResume && r.State == store.RolloutRunning,
			action == ActionAbort && r.State == store.RolloutAborted:
			return r, nil
		case action != ActionPause && action != ActionResume && action != ActionAbort:
			return r, refusal.New(protocol.CodeInvalidInput, "action %q: want pause, resume or abort", human.ShortN(action, 40))
		default:
			return r, refusal.New(protocol.CodeInvalidInput, "rollout %s is %s: it cannot %s", r.ID, r.State, action)
		}
		now := s.now()
		msg := reason
		if to == store.RolloutRunning {
			msg = "resumed by the operator"
		}
		err = s.Store.StepRollout(ctx, store.RolloutStep{RolloutID: r.ID, Revision: r.Revision, State: to, Reason: reason,
			Timeline: []store.RolloutEvent{{At: now, Message: msg}}, At: now})
		if errors.Is(err, store.ErrRolloutChanged) {
			continue
		}
		if err != nil {
			return r, err
		}
		s.log().Info("rollout "+action, "rollout", r.ID)
		s.kick()
		return s.Store.GetRollout(ctx, r.ID)
	}
	return store.Rollout{}, refusal.Unavailable("the rollout kept changing; try again")
}

// Upgrade is a daemon.upgrade for one node: a stored Version, or a
// Manifest (checked for its form only: the node verifies it) whose binary
// is at URL, or by default below URLBase.
type Upgrade struct {
	Version  string
	Manifest []byte
	URL      string
	URLBase  string
}

// UpgradeNode sends the node a daemon.upgrade now.
func (s *Service) UpgradeNode(ctx context.Context, nodeID string, in Upgrade) (store.Command, error) {
	n, err := s.Store.GetNode(ctx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Command{}, refusal.New(protocol.CodeNotFound, "node %s does not exist", human.ShortN(nodeID, 80))
	case err != nil:
		return store.Command{}, err
	case n.Deleted():
		return store.Command{}, refusal.New(protocol.CodeNodeRevoked, "node %s was deleted", n.ID)
	case !protocol.KindAllowed(n.Role, protocol.KindDaemonUpgrade):
		return store.Command{}, refusal.New(protocol.CodeUnsupported, "a %s does not run %s", n.Role, protocol.KindDaemonUpgrade)
	case (in.Version == "") == (len(in.Manifest) == 0):
		return store.Command{}, refusal.New(protocol.CodeInvalidInput, "give a version (--version) or a manifest (--manifest), one of them")
	case n.DaemonArch == "":
		return store.Command{}, refusal.New(protocol.CodeUnsupported,
			"node %s has not reported its architecture (daemon_arch, from a bcd that has self-update): no binary to name", n.ID)
	}
	var sec protocol.DaemonSection
	if in.Version != "" {
		if in.URL != "" {
			return store.Command{}, refusal.New(protocol.CodeInvalidInput, "url (--url) goes with a manifest (--manifest), not a version")
		}
		rel, err := s.release(ctx, in.Version)
		if err != nil {
			return store.Command{}, err
		}
		b, ok := rel.Binary(n.DaemonArch)
		if !ok {
			return store.Command{}, refusal.New(pki.ErrReleaseIncomplete.Error(), "release %s has no binary for linux/%s (node %s)", rel.Version, n.DaemonArch, n.ID)
		}
		sec = protocol.DaemonSection{Version: rel.Version, URL: rel.BinaryURL(n.DaemonArch), SHA256: b.SHA256, Signature: rel.Manifest}
	} else {
		m, err := pki.ParseManifest(in.Manifest)
		if err != nil {
			return store.Command{}, refusal.New(protocol.CodeInvalidInput, "manifest (--manifest): %v", err)
		}
		if m.Release.Product != Product {
			return store.Command{}, refusal.New(pki.ErrReleaseMismatch.Error(), "the manifest is for product %q, want %s", m.Release.Product, Product)
		}
		version := strings.TrimPrefix(m.Release.Version, "v")
		name := pki.BinaryName(Product, m.Release.Version, "linux", n.DaemonArch)
		a, ok := m.Release.Artifact(name)
		if !ok {
			return store.Command{}, refusal.New(pki.ErrReleaseIncomplete.Error(), "the manifest of %s %s does not list %s (node %s is linux/%s)",
				Product, m.Release.Version, name, n.ID, n.DaemonArch)
		}
		u := in.URL
		if u == "" {
			base, err := CheckURLBase("url_base", in.URLBase)
			if err != nil {
				return store.Command{}, err
			}
			u = base + "/downloads/bcd/" + version + "/linux-" + n.DaemonArch
		} else if _, err := CheckURLBase("url (--url)", u); err != nil {
			return store.Command{}, err
		}
		sec = protocol.DaemonSection{Version: version, URL: u, SHA256: a.SHA256, Signature: string(in.Manifest)}
	}
	now := s.now()
	params, err := json.Marshal(sec)
	if err != nil {
		return store.Command{}, err
	}
	c := store.Command{ID: ids.New(ids.PrefixCommand, now), NodeID: n.ID, Kind: protocol.KindDaemonUpgrade, Params: params,
		State: store.CommandPending, CreatedAt: now, UpdatedAt: now}
	if err := s.Store.CreateCommand(ctx, c); err != nil {
		return store.Command{}, err
	}
	if s.Notifier != nil {
		s.Notifier.Notify(n.ID)
	}
	s.log().Info("daemon.upgrade enqueued", "command", c.ID, "node", n.ID, "version", sec.Version, "url", sec.URL)
	return c, nil
}
