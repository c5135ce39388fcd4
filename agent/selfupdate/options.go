package selfupdate

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/buildmode"
	"github.com/better-compute/bcd/internal/version"
)

// Defaults the spec gives (step 2 and 3).
const (
	DefaultDeadline    = 120 * time.Second
	DefaultIdleTimeout = 60 * time.Second
	DefaultMaxSize     = 512 << 20
	// DefaultUnitDir is where the rollback unit and the drop-in go.
	DefaultUnitDir = "/etc/systemd/system"
)

// Options is what a Manager works with. The paths come from OptionsFor; the
// durations and sizes are how tests shorten things.
type Options struct {
	// Pins are [update] release_pins; with none every update is refused
	// (NO_RELEASE_PINS).
	Pins []string
	// Threshold is [update] release_threshold; 0 means 1.
	Threshold int
	// ConfigFloor is [update] release_sequence: the installed release's
	// sequence, the floor before any update raised it.
	ConfigFloor int64
	// SlotsDir is config.SlotsDir(): bcd-a, bcd-b, current, previous,
	// slots.json.
	SlotsDir string
	// RecordsDir is where upgrade.json, update.json and the lock live.
	RecordsDir string
	// DataDir holds the staging directory, DataDir/staging.
	DataDir string
	// Entrypoint is [update] entrypoint: the path bcd is started from.
	Entrypoint string
	// ConfigPath is the config.toml the rollback unit passes to
	// bcd update --rollback.
	ConfigPath string
	// UnitDir is where the rollback unit and drop-in go; "" = DefaultUnitDir.
	UnitDir string
	// Systemd writes the rollback unit and drop-in and runs
	// systemctl daemon-reload at a swap. New refuses it in a fakehw build.
	Systemd bool
	// RequireRoot makes adoption take only a root-owned entrypoint that
	// group and others cannot write (set when running as root).
	RequireRoot bool
	// CheckStagedOwner makes a swap take only a staged file that
	// StagedOwner's uid owns: bcd helper sets it to the node user's uid, so
	// that a file the node did not write (root's, another user's) is never
	// installed (spec, c139b9c).
	CheckStagedOwner bool
	StagedOwner      int
	// Deadline is how long a swapped binary has for its first Welcome;
	// 0 = DefaultDeadline.
	Deadline time.Duration
	// IdleTimeout is the download's idle watchdog; 0 = DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxSize bounds the binary; 0 = DefaultMaxSize.
	MaxSize int64
	// HTTPClient downloads the release (the caller sets proxy and TLS);
	// nil = a client with ProxyFromEnvironment.
	HTTPClient *http.Client
	// Running is version.Version of this process.
	Running string
	// Now is the host clock; nil = time.Now.
	Now func() time.Time
	// Logger; nil discards.
	Logger *slog.Logger
}

// RecordsDirFor is where c's upgrade.json and update.json are, found the way
// bcd update and bcd doctor find them (spec, 8eca2b1): under bcd helper in
// the slots directory (root's), else in data_dir.
func RecordsDirFor(c *config.Config) string {
	if c.Helper != nil {
		return c.SlotsDir()
	}
	return dataDirOf(c)
}

func dataDirOf(c *config.Config) string {
	if c.DataDir != "" {
		return c.DataDir
	}
	return config.DefaultDataDir
}

// OptionsFor fills the paths, pins and floor from a loaded config. Systemd is
// set when the host runs systemd (sd_booted's test) and this is not a fakehw
// build; RequireRoot when this process is root. The caller adds the client,
// the logger and any test durations.
func OptionsFor(c *config.Config, configPath string) Options {
	u := c.UpdateOrDefault()
	entry := u.Entrypoint
	if entry == "" {
		entry = config.DefaultEntrypoint
	}
	_, err := os.Stat("/run/systemd/system")
	return Options{
		Pins:        u.ReleasePins,
		Threshold:   max(int(u.ReleaseThreshold), 1),
		ConfigFloor: u.ReleaseSequence,
		SlotsDir:    c.SlotsDir(),
		RecordsDir:  RecordsDirFor(c),
		DataDir:     dataDirOf(c),
		Entrypoint:  entry,
		ConfigPath:  configPath,
		Systemd:     err == nil && !buildmode.FakeHW,
		RequireRoot: os.Geteuid() == 0,
		Running:     version.Version,
	}
}

// Manager keeps one host's slots and records.
type Manager struct {
	o      Options
	log    *slog.Logger
	client *http.Client
}

// New checks o and fills its defaults.
func New(o Options) (*Manager, error) {
	for _, p := range []struct{ name, path string }{
		{"slots directory", o.SlotsDir}, {"records directory", o.RecordsDir},
		{"data directory", o.DataDir}, {"entrypoint", o.Entrypoint},
	} {
		if !filepath.IsAbs(p.path) {
			return nil, fmt.Errorf("selfupdate: the %s %q is not an absolute path", p.name, p.path)
		}
	}
	if !builtVersionRE.MatchString(o.Running) {
		return nil, fmt.Errorf("selfupdate: the running version %q is not a version", o.Running)
	}
	if o.Systemd && buildmode.FakeHW {
		return nil, errors.New("selfupdate: a fakehw build never writes the systemd rollback unit")
	}
	if o.Systemd && !filepath.IsAbs(o.ConfigPath) {
		return nil, fmt.Errorf("selfupdate: the rollback unit needs the absolute config path, not %q", o.ConfigPath)
	}
	if o.Threshold == 0 {
		o.Threshold = 1
	}
	if o.UnitDir == "" {
		o.UnitDir = DefaultUnitDir
	}
	if o.Deadline == 0 {
		o.Deadline = DefaultDeadline
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxSize == 0 {
		o.MaxSize = DefaultMaxSize
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	client := o.HTTPClient
	if client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = http.ProxyFromEnvironment
		client = &http.Client{Transport: t}
	}
	return &Manager{o: o, log: log, client: client}, nil
}

func (m *Manager) now() time.Time { return m.o.Now() }

// ForRunning is m for a process that runs version v: bcd helper's Manager
// answers the node's Resume, Confirm and Swap for the node's version, not
// its own (the helper keeps running the binary it started from until it
// restarts).
func (m *Manager) ForRunning(v string) (*Manager, error) {
	if !builtVersionRE.MatchString(v) {
		return nil, fmt.Errorf("selfupdate: the running version %q is not a version", v)
	}
	c := *m
	c.o.Running = v
	return &c, nil
}

// Options is what m was made with, defaults filled.
func (m *Manager) Options() Options { return m.o }
