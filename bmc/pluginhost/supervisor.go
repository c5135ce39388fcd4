package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"google.golang.org/grpc/health/grpc_health_v1"

	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/bmc/bmcplugin"
	"github.com/better-compute/bcd/bmc/sandbox"
)

// supervisor keeps one plugin running: it starts it, watches it, and starts it
// again with backoff whenever it ends.
type supervisor struct {
	h          *Host
	name       string
	privileged bool

	mu       sync.Mutex
	inst     *instance     // the running instance, or nil
	err      error         // why there is none
	lastErr  error         // why the last start failed or the last instance ended
	refused  bool          // err is a refusal: calls fail at once
	changed  chan struct{} // closed and replaced on every change above
	restarts int
}

// instance is one run of the plugin.
type instance struct {
	client  *goplugin.Client
	driver  *bmcplugin.Client
	runner  *procRunner
	uid     int
	started time.Time

	mu        sync.Mutex
	killedFor string // why the host killed it, if it did
}

func (s *supervisor) set(inst *instance, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inst, s.err = inst, err
	if err != nil {
		s.lastErr = err
	}
	s.refused = errors.Is(err, errRefused)
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *supervisor) status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{Name: s.name, Restarts: s.restarts}
	if s.lastErr != nil {
		st.LastError = s.lastErr.Error()
	}
	if s.inst != nil {
		st.Running, st.PID, st.UID, st.Since = true, s.inst.runner.pid, s.inst.uid, s.inst.started
	}
	return st
}

func (s *supervisor) run() {
	h := s.h
	log := h.logger().With("plugin", s.name)
	backoff := orDefault(h.MinBackoff, DefaultMinBackoff)
	maxBackoff := orDefault(h.MaxBackoff, DefaultMaxBackoff)
	for {
		inst, err := s.start()
		if err != nil {
			// Log before the state changes, so whoever sees the state finds the line.
			log.Error("plugin not started", "error", err, "retry_in", backoff)
			s.set(nil, err)
		} else {
			s.set(inst, nil)
			log.Info("plugin started", "pid", inst.runner.pid, "uid", inst.uid)
			reason := s.watch(inst)
			if reason == "" {
				s.set(nil, errors.New("bcd is stopping"))
				return
			}
			if time.Since(inst.started) > stableAfter {
				backoff = orDefault(h.MinBackoff, DefaultMinBackoff)
			}
			log.Error("plugin stopped", "reason", reason, "restart_in", backoff)
			s.mu.Lock()
			s.restarts++
			s.mu.Unlock()
			s.set(nil, fmt.Errorf("plugin %s stopped: %s", s.name, reason))
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-h.done:
			t.Stop()
			return
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

// start verifies the plugin and starts it in its sandbox; it returns once the
// plugin has answered go-plugin's handshake.
func (s *supervisor) start() (*instance, error) {
	h := s.h
	bin, _, err := openVerified(h.Dir, s.name)
	if err != nil {
		return nil, err
	}
	defer bin.Close()
	launcher, err := h.launcher()
	if err != nil {
		return nil, err
	}
	spec := sandbox.Spec{Name: s.name, Privileged: s.privileged, NoFile: pluginNoFile, NameLink: true}
	if !s.privileged {
		ids, err := sandbox.PluginIDs(s.name)
		if err != nil {
			return nil, refuse("plugin %s: %w", s.name, err)
		}
		if ids.UID == os.Geteuid() {
			return nil, refuse("plugin %s would run as bcd's own uid %d", s.name, ids.UID)
		}
		spec.UID, spec.GID = ids.UID, ids.GID
		// The uid is the plugin's own, so the kernel's per-uid count is its count.
		spec.NProc = uint64(h.pidsMax())
	}
	if h.cgroup != nil {
		cg, err := h.cgroup.Plugin(s.name)
		if err != nil {
			return nil, err
		}
		defer cg.Close()
		spec.Cgroup = cg
	}
	inst := &instance{uid: spec.UID}
	stderr := &tail{}
	inst.client = goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig:  bmcplugin.Handshake,
		Plugins:          bmcplugin.PluginMap(nil),
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		SkipHostEnv:      true,
		StartTimeout:     orDefault(h.StartTimeout, DefaultStartTimeout),
		Logger:           newHCLogger(h.logger().With("plugin", s.name)),
		Stderr:           stderr,
		UnixSocketConfig: &goplugin.UnixSocketConfig{TempDir: h.runtimeDir()},
		RunnerFunc: func(_ hclog.Logger, proto *exec.Cmd, socketDir string) (runner.Runner, error) {
			cmd, err := sandbox.Command(launcher, spec, bin)
			if err != nil {
				return nil, err
			}
			cmd.Env = pluginEnv(proto.Env)
			// The launcher starts as root in the socket directory, which the
			// plugin then reaches as "." although it cannot walk to it.
			cmd.Dir = socketDir
			if !spec.Privileged {
				if err := os.Chown(socketDir, spec.UID, spec.GID); err != nil {
					return nil, fmt.Errorf("give %s its socket directory: %w", s.name, err)
				}
			}
			var kill func() bool
			if h.cgroup != nil {
				kill = func() bool {
					ok, err := h.cgroup.Kill(s.name)
					return ok && err == nil
				}
			}
			inst.runner, err = newRunner(s.name, cmd, socketDir, kill)
			return inst.runner, err
		},
	})
	fail := func(err error) (*instance, error) {
		if inst.runner != nil {
			inst.runner.Kill(context.Background())
		}
		inst.client.Kill()
		if line := stderr.lastLine(); line != "" {
			return nil, fmt.Errorf("plugin %s did not start: %w (its last words: %s)", s.name, err, line)
		}
		return nil, fmt.Errorf("plugin %s did not start: %w", s.name, err)
	}
	proto, err := inst.client.Client()
	if err != nil {
		return fail(err)
	}
	raw, err := proto.Dispense(bmcplugin.Name)
	if err != nil {
		return fail(err)
	}
	drv, ok := raw.(*bmcplugin.Client)
	if !ok {
		return fail(fmt.Errorf("it serves %T, not a BMC driver", raw))
	}
	inst.driver = drv
	inst.started = time.Now()
	return inst, nil
}

// pluginEnv is go-plugin's environment for the plugin with the socket directory
// made relative: the plugin runs in it.
func pluginEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if strings.HasPrefix(kv, goplugin.EnvUnixSocketDir+"=") {
			kv = goplugin.EnvUnixSocketDir + "=."
		}
		out = append(out, kv)
	}
	return out
}

// watch returns why the instance ended, or "" when the host is closing (and
// then it has stopped the instance itself).
func (s *supervisor) watch(inst *instance) string {
	h := s.h
	tick := time.NewTicker(orDefault(h.HealthInterval, DefaultHealthInterval))
	defer tick.Stop()
	for {
		select {
		case <-inst.runner.done:
			inst.client.Kill() // releases go-plugin's side: goroutines, socket directory
			return inst.endReason()
		case <-h.done:
			inst.client.Kill() // asks the plugin to shut down, then kills it
			<-inst.runner.done
			return ""
		case <-tick.C:
			if err := inst.health(); err != nil {
				inst.kill("it failed its health check: " + err.Error())
			}
		}
	}
}

func (i *instance) health() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultHealthTimeout)
	defer cancel()
	r, err := grpc_health_v1.NewHealthClient(i.driver.Conn()).Check(ctx,
		&grpc_health_v1.HealthCheckRequest{Service: goplugin.GRPCServiceName})
	if err != nil {
		return err
	}
	if r.Status != grpc_health_v1.HealthCheckResponse_SERVING {
		return fmt.Errorf("status %s", r.Status)
	}
	return nil
}

// kill ends the instance at once (its whole cgroup, where it has one); the
// supervisor notices the exit and restarts it.
func (i *instance) kill(reason string) {
	i.mu.Lock()
	if i.killedFor == "" {
		i.killedFor = reason
	}
	i.mu.Unlock()
	i.runner.Kill(context.Background())
}

// dead reports whether the process is gone or being killed; the supervisor may
// not have noticed yet.
func (i *instance) dead() bool {
	i.mu.Lock()
	killed := i.killedFor != ""
	i.mu.Unlock()
	select {
	case <-i.runner.done:
		return true
	default:
		return killed
	}
}

func (i *instance) endReason() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.killedFor != "" {
		return "killed because " + i.killedFor
	}
	return i.runner.exitReason()
}

// acquire returns the running instance, waiting for one to start if need be. A
// plugin whose start was refused fails the call at once, with the reason.
func (s *supervisor) acquire(ctx context.Context) (*instance, error) {
	for {
		s.mu.Lock()
		inst, err, refused, changed := s.inst, s.err, s.refused, s.changed
		s.mu.Unlock()
		if inst != nil && !inst.dead() {
			return inst, nil
		}
		if inst == nil && refused {
			return nil, &bmc.Error{Kind: bmc.KindPlugin, Msg: fmt.Sprintf("plugin %s is not running: %v", s.name, err), Err: err}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			msg := fmt.Sprintf("plugin %s did not come up in time", s.name)
			if err != nil {
				msg += " (" + err.Error() + ")"
			}
			return nil, &bmc.Error{Kind: bmc.KindPlugin, Msg: msg, Err: ctx.Err()}
		case <-s.h.done:
			return nil, &bmc.Error{Kind: bmc.KindPlugin, Msg: fmt.Sprintf("plugin %s: bcd is stopping", s.name)}
		}
	}
}
