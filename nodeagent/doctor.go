package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/user"
	"strconv"
	"sync"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/nodeagent/helper"
)

// Level is how a check came out.
type Level int

// Levels, in order of gravity.
const (
	OK Level = iota
	Warn
	Fail
)

func (l Level) String() string {
	switch l {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	}
	return "fail"
}

// Result is one check's outcome and what an operator should know about it.
type Result struct {
	Level  Level
	Detail string
}

// Check is one thing bcd doctor looks at.
type Check interface {
	Name() string
	Run(ctx context.Context) Result
}

type checkFunc struct {
	name string
	run  func(context.Context) Result
}

func (c checkFunc) Name() string                   { return c.name }
func (c checkFunc) Run(ctx context.Context) Result { return c.run(ctx) }

// CheckFunc makes a Check of a name and a function.
func CheckFunc(name string, run func(context.Context) Result) Check {
	return checkFunc{name, run}
}

// RunChecks runs every check at once and writes "name: level: detail" lines in the
// checks' order. It reports whether any failed.
func RunChecks(ctx context.Context, w io.Writer, checks []Check) (failed bool) {
	results := make([]Result, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = c.Run(ctx)
		}()
	}
	wg.Wait()
	for i, c := range checks {
		fmt.Fprintf(w, "%s: %s: %s\n", c.Name(), results[i].Level, results[i].Detail)
		if results[i].Level == Fail {
			failed = true
		}
	}
	return failed
}

// DoctorOptions tune DoctorChecks; the zero value is bcd doctor's.
type DoctorOptions struct {
	// ParseOptions read config.toml as the daemon does.
	ParseOptions config.ParseOptions
	// GatewayTimeout bounds the gateway check; 0 means 5 seconds.
	GatewayTimeout time.Duration
	// ExpiryWarning warns about a certificate that expires sooner; 0 means
	// within the last third of its lifetime (past the point it renews at).
	ExpiryWarning time.Duration
	// Now is the clock certificates are judged by; nil means time.Now.
	Now func() time.Time
	// IsRoot says whether doctor runs as root, which the helper checks need;
	// nil means os.Geteuid() == 0.
	IsRoot func() bool
	// NeighbourLimitFile is read for the neighbours check; "" means the
	// kernel's (NeighbourLimitFile).
	NeighbourLimitFile string
	// SiteMachines counts the machines a site agent serves from what it saved
	// in dataDir, and says whether it saved anything (site.ServedMachines;
	// nodeagent does not link the site agent). Nil: no neighbours check.
	SiteMachines func(dataDir string) (machines int, saved bool, err error)
}

// DoctorChecks are bcd doctor's checks for the configuration at path: config,
// identity, tpm, gateway and update (self-update's slots and records); on a
// node with [helper] the helper checks (helperChecks) after them; on a site
// agent ([boot]) neighbours, the kernel's neighbour table beside the machines
// the site serves; and libvirt where the host has libvirt's qemu.conf.
func DoctorChecks(path string, o DoctorOptions) []Check {
	if o.GatewayTimeout <= 0 {
		o.GatewayTimeout = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NeighbourLimitFile == "" {
		o.NeighbourLimitFile = NeighbourLimitFile
	}
	if o.IsRoot == nil {
		o.IsRoot = func() bool { return os.Geteuid() == 0 }
	}
	// One read of the file for every check, so they judge the same content.
	cfg, cfgErr := config.Load(path, o.ParseOptions)
	var (
		idOnce sync.Once
		id     *agent.Identity
		idErr  error
	)
	identity := func() (*agent.Identity, error) {
		idOnce.Do(func() { id, idErr = agent.LoadIdentity(DataDir(cfg), &nodekey.Host{}) })
		return id, idErr
	}
	checks := []Check{
		CheckFunc("config", func(context.Context) Result { return checkConfig(path, cfg, cfgErr) }),
		CheckFunc("identity", func(context.Context) Result {
			if cfgErr != nil {
				return Result{Fail, "config.toml does not load, so data_dir is unknown"}
			}
			id, err := identity()
			return checkIdentity(DataDir(cfg), id, err, o.Now(), o.ExpiryWarning)
		}),
		CheckFunc("tpm", func(context.Context) Result {
			if cfgErr != nil {
				return Result{Fail, "config.toml does not load, so data_dir and [helper] are unknown"}
			}
			return checkTPM(cfg, hostTPMFiles)
		}),
		CheckFunc("gateway", func(ctx context.Context) Result {
			if cfgErr != nil {
				return Result{Fail, "config.toml does not load, so the gateway is unknown"}
			}
			id, _ := identity()
			return checkGateway(ctx, cfg, id, o.GatewayTimeout)
		}),
		CheckFunc("update", func(context.Context) Result {
			if cfgErr != nil {
				return Result{Fail, "config.toml does not load, so [update] and the slots are unknown"}
			}
			return checkUpdate(cfg, path)
		}),
	}
	if cfgErr == nil && cfg.Helper != nil {
		checks = append(checks, helperChecks(cfg, path, o.IsRoot())...)
	}
	if cfgErr == nil && cfg.Boot != nil && o.SiteMachines != nil {
		checks = append(checks, CheckFunc("neighbours", func(context.Context) Result {
			return checkNeighbours(cfg, o.NeighbourLimitFile, o.SiteMachines)
		}))
	}
	if hasLibvirt(hostLibvirtFiles) {
		checks = append(checks, CheckFunc("libvirt", func(context.Context) Result {
			if cfgErr != nil {
				return Result{Fail, "config.toml does not load, so [helper] is unknown"}
			}
			return checkLibvirt(cfg, hostLibvirtFiles)
		}))
	}
	return checks
}

func checkConfig(path string, cfg *config.Config, loadErr error) Result {
	if loadErr != nil {
		return Result{Fail, loadErr.Error()}
	}
	perm, err := config.Permissions(path)
	if err != nil {
		return Result{Warn, fmt.Sprintf("%s loads, but its permissions are unknown: %v", path, err)}
	}
	if cfg.Helper != nil && perm.Mode&0o077 == 0o040 {
		// A helper node's config.toml is 0640 with the node user's group, so
		// the unprivileged node can read it (spec "Running bcd node
		// unprivileged", step 4); chmod 600 would lock it out. Whether that
		// group is the node's, and root owns the file, the helper check says.
		name := helper.UserName(cfg)
		if u, err := user.Lookup(name); err == nil && u.Gid == strconv.Itoa(int(perm.GID)) {
			return Result{OK, fmt.Sprintf("%s loads (%s, group %d: bcd node reads it as %s)", path, perm, perm.GID, name)}
		}
		return Result{Warn, fmt.Sprintf("%s loads, but it is readable by group %d, not by the primary group of [helper] user %s (%s); chown root:%s %s", path, perm.GID, name, perm, name, path)}
	}
	if !perm.OK() {
		return Result{Warn, fmt.Sprintf("%s loads, but anyone besides its owner may touch it (%s); chmod 600 %s", path, perm, path)}
	}
	return Result{OK, fmt.Sprintf("%s loads (%s)", path, perm)}
}

func checkIdentity(dataDir string, id *agent.Identity, err error, now time.Time, warnBefore time.Duration) Result {
	switch {
	case errors.Is(err, agent.ErrNotJoined):
		return Result{Fail, fmt.Sprintf("not joined: no %s in %s; run bcd join", agent.IdentityFile, dataDir)}
	case err != nil:
		return Result{Fail, fmt.Sprintf("the identity does not load: %v; to join again: %s", err, ResetHint)}
	}
	leaf := id.Leaf()
	until := leaf.NotAfter.UTC().Format(time.RFC3339)
	switch {
	case now.After(leaf.NotAfter):
		return Result{Fail, fmt.Sprintf("the certificate of %s %s expired at %s; to join again: %s", id.Role, id.NodeID, until, ResetHint)}
	case now.Before(leaf.NotBefore):
		return Result{Fail, fmt.Sprintf("the certificate of %s %s is not valid before %s: is the clock right?", id.Role, id.NodeID, leaf.NotBefore.UTC().Format(time.RFC3339))}
	}
	lastThird := warnBefore <= 0
	if lastThird {
		warnBefore = agent.CertLifetime(id) / 3
	}
	if leaf.NotAfter.Sub(now) < warnBefore {
		why := ""
		if lastThird {
			why = " (in the last third of its lifetime: it should have been renewed at two thirds; see renewal on bcd node's status socket)"
		}
		return Result{Warn, fmt.Sprintf("%s %s: the certificate expires soon, at %s%s", id.Role, id.NodeID, until, why)}
	}
	site := id.Site
	if site == "" {
		site = "none"
	}
	return Result{OK, fmt.Sprintf("%s %s (site %s), certificate valid until %s", id.Role, id.NodeID, site, until)}
}

// checkGateway completes a TLS handshake with the gateway under the pin. It offers
// the node certificate when the identity loads, since a gateway may insist on one.
func checkGateway(ctx context.Context, c *config.Config, id *agent.Identity, timeout time.Duration) Result {
	u, err := url.Parse(c.GatewayURL)
	if err != nil || u.Host == "" {
		return Result{Fail, fmt.Sprintf("gateway_url %q has no host", c.GatewayURL)}
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"https": "443", "http": "80"}[u.Scheme]
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	if u.Scheme == "http" {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return Result{Fail, fmt.Sprintf("%s: %v", addr, err)}
		}
		conn.Close()
		return Result{Warn, fmt.Sprintf("%s reachable over plain http (development build only)", addr)}
	}
	serverName, err := agent.ServerName(c.GatewayURL, c.GatewayServerName)
	if err != nil {
		return Result{Fail, err.Error()}
	}
	var cfg *tls.Config
	if id != nil {
		cfg, err = agent.ClientTLSConfig(id, c.ServingCASPKIPin, serverName)
	} else {
		cfg, err = agent.PinnedTLSConfig(c.ServingCASPKIPin, serverName)
	}
	if err != nil {
		return Result{Fail, err.Error()}
	}
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return Result{Fail, fmt.Sprintf("%s: %v", addr, err)}
	}
	conn.Close()
	return Result{OK, fmt.Sprintf("%s: TLS verified to the pinned serving CA for %s in %s", addr, serverName, time.Since(start).Round(time.Millisecond))}
}
