package pluginhost

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/bmc/pins"
	"github.com/better-compute/bcd/bmc/sandbox"
	"github.com/better-compute/bcd/config"
)

// Defaults of a Host's zero fields.
const (
	DefaultRuntimeDir     = "/run/bcd/plugins"
	DefaultCallTimeout    = time.Minute
	DefaultStartTimeout   = 15 * time.Second
	DefaultHealthInterval = 10 * time.Second
	DefaultHealthTimeout  = 5 * time.Second
	DefaultMinBackoff     = 500 * time.Millisecond
	DefaultMaxBackoff     = time.Minute
	// A plugin that ran this long before it died starts again at MinBackoff.
	stableAfter = time.Minute
	// The launcher's RLIMIT_NOFILE for a plugin.
	pluginNoFile = 1024
)

// Host runs the plugins of one bcd process. Set its fields, call Start, then
// Driver for each plugin in use; Close stops them all. Zero values mean the
// defaults above.
type Host struct {
	// Dir is [plugins] dir: the plugin binaries and their pins file.
	Dir string
	// Cgroup is [plugins] cgroup. Empty leaves plugins in bcd's own cgroup, with
	// no memory or pids limit of their own (Start logs a warning).
	Cgroup string
	// Privileged names the plugins that keep bcd's uid and capabilities.
	Privileged []string
	// MemoryMax and PidsMax limit each plugin's cgroup; PidsMax is also a
	// confined plugin's RLIMIT_NPROC. Zero means config's defaults.
	MemoryMax, PidsMax int64
	// Launcher starts the sandbox launcher: the program and its first arguments,
	// to which the launcher's flags are added. Nil means this very binary's
	// hidden `plugin-exec` command (through /proc/self/exe, which still names it
	// after a self-update replaced the file).
	Launcher []string
	// RuntimeDir holds the plugins' socket directories.
	RuntimeDir string
	// CallTimeout bounds one driver call; a plugin that does not answer in time is
	// killed and restarted.
	CallTimeout time.Duration
	// StartTimeout bounds a plugin's start, up to its handshake.
	StartTimeout time.Duration
	// HealthInterval is how often a running plugin is health-checked; one that
	// does not answer within DefaultHealthTimeout is killed and restarted.
	HealthInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait before a plugin is started again.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives the host's and the plugins' log lines; nil means
	// slog.Default().
	Logger *slog.Logger

	mu       sync.Mutex
	started  bool
	startErr error
	closed   bool
	cgroup   *sandbox.Cgroup
	plugins  map[string]*supervisor
	done     chan struct{}
	wg       sync.WaitGroup
}

// New returns a Host for a [plugins] section.
func New(p *config.Plugins, logger *slog.Logger) *Host {
	return &Host{Dir: p.Dir, Cgroup: p.Cgroup, Privileged: p.Privileged, MemoryMax: p.MemoryMax, PidsMax: p.PidsMax, Logger: logger}
}

// Start prepares what every plugin needs: the runtime directory and the plugins'
// cgroup. When the cgroup cannot be prepared no plugin runs: the error (also
// logged) says why, and Driver returns it.
func (h *Host) Start() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.started {
		return h.startErr
	}
	h.started = true
	h.done = make(chan struct{})
	h.plugins = map[string]*supervisor{}
	h.startErr = h.prepare()
	if h.startErr != nil {
		h.logger().Error("no plugin runs", "error", h.startErr)
	}
	return h.startErr
}

func (h *Host) prepare() error {
	if h.Dir == "" {
		return errors.New("plugins: [plugins] dir is not set")
	}
	if fi, err := os.Stat(h.Dir); err != nil {
		return fmt.Errorf("plugins: %w", err)
	} else if !fi.IsDir() {
		return fmt.Errorf("plugins: %s is not a directory", h.Dir)
	}
	if err := os.MkdirAll(h.runtimeDir(), 0o700); err != nil {
		return fmt.Errorf("plugins: runtime directory: %w", err)
	}
	if h.Cgroup == "" {
		h.logger().Warn("plugins run without a cgroup of their own: set [plugins] cgroup to limit their memory and processes", "dir", h.Dir)
		return nil
	}
	cg := &sandbox.Cgroup{Path: h.Cgroup, MemoryMax: h.memoryMax(), PidsMax: h.pidsMax()}
	moved, err := cg.Prepare()
	if len(moved) > 0 {
		h.logger().Info("moved bcd's processes into a leaf cgroup so plugins' cgroups get controllers",
			"leaf", sandbox.MainLeaf, "pids", moved)
	}
	if err != nil {
		return fmt.Errorf("plugins: cgroup %s cannot be prepared: %w", h.Cgroup, err)
	}
	h.cgroup = cg
	return nil
}

// Driver returns the BMC driver plugin name (e.g. "bcx-ipmi"), starting and
// supervising it from now on. Its calls wait for the plugin to be up.
func (h *Host) Driver(name string) (bmc.Driver, error) {
	s, err := h.supervise(name)
	if err != nil {
		return nil, err
	}
	return &pluginDriver{s: s}, nil
}

func (h *Host) supervise(name string) (*supervisor, error) {
	if !pins.ValidName(name) {
		return nil, fmt.Errorf("plugins: %q is not a plugin name", name)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case !h.started:
		return nil, errors.New("plugins: the host has not been started")
	case h.startErr != nil:
		return nil, h.startErr
	case h.closed:
		return nil, errors.New("plugins: the host is closed")
	}
	if s, ok := h.plugins[name]; ok {
		return s, nil
	}
	s := &supervisor{h: h, name: name, privileged: slices.Contains(h.Privileged, name), changed: make(chan struct{})}
	h.plugins[name] = s
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		s.run()
	}()
	return s, nil
}

// Status is a plugin's state, for logs and doctor.
type Status struct {
	Name     string
	Running  bool
	PID      int // the plugin's process while it runs
	UID      int // the uid it runs as (0 for a privileged plugin)
	Since    time.Time
	Restarts int
	// LastError says why the plugin is not running, or why it last stopped.
	LastError string
}

// Status reports the plugin's state; false when the host does not run it.
func (h *Host) Status(name string) (Status, bool) {
	h.mu.Lock()
	s, ok := h.plugins[name]
	h.mu.Unlock()
	if !ok {
		return Status{}, false
	}
	return s.status(), true
}

// Close stops every plugin (gracefully, then by force) and removes their cgroups.
func (h *Host) Close() error {
	h.mu.Lock()
	if !h.started || h.closed {
		h.closed = true
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	close(h.done)
	names := make([]string, 0, len(h.plugins))
	for n := range h.plugins {
		names = append(names, n)
	}
	h.mu.Unlock()
	h.wg.Wait()
	var errs []error
	if h.cgroup != nil {
		for _, n := range names {
			if err := h.cgroup.Remove(n); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (h *Host) logger() *slog.Logger {
	if h.Logger == nil {
		return slog.Default()
	}
	return h.Logger
}

func (h *Host) runtimeDir() string {
	if h.RuntimeDir == "" {
		return DefaultRuntimeDir
	}
	return h.RuntimeDir
}

func (h *Host) memoryMax() int64 {
	if h.MemoryMax <= 0 {
		return config.DefaultPluginMemory
	}
	return h.MemoryMax
}

func (h *Host) pidsMax() int64 {
	if h.PidsMax <= 0 {
		return config.DefaultPluginPids
	}
	return h.PidsMax
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func (h *Host) launcher() ([]string, error) {
	if len(h.Launcher) > 0 {
		return h.Launcher, nil
	}
	return []string{"/proc/self/exe", "plugin-exec"}, nil
}
