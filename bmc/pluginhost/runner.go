package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/go-plugin/runner"
)

// procRunner is go-plugin's view of one sandboxed plugin process: it starts the
// launcher command, records how the process ended, and kills it (and everything in
// its cgroup) on request.
type procRunner struct {
	name      string
	cmd       *exec.Cmd
	socketDir string
	stdout    io.ReadCloser
	stderr    io.ReadCloser
	// killCgroup kills the plugin's cgroup, when it has one; it reports whether
	// it did.
	killCgroup func() bool

	pid     int
	done    chan struct{} // closed once the process has been waited for
	mu      sync.Mutex
	waitErr error
}

var _ runner.Runner = (*procRunner)(nil)

func newRunner(name string, cmd *exec.Cmd, socketDir string, killCgroup func() bool) (*procRunner, error) {
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	return &procRunner{name: name, cmd: cmd, socketDir: socketDir, stdout: stdout, stderr: stderr,
		killCgroup: killCgroup, done: make(chan struct{})}, nil
}

func (r *procRunner) Start(context.Context) error {
	if err := r.cmd.Start(); err != nil {
		return fmt.Errorf("start the launcher for %s: %w", r.name, err)
	}
	r.pid = r.cmd.Process.Pid
	return nil
}

// Wait is called once, by go-plugin, and returns when the process is gone.
func (r *procRunner) Wait(context.Context) error {
	err := r.cmd.Wait()
	r.mu.Lock()
	r.waitErr = err
	r.mu.Unlock()
	close(r.done)
	return err
}

// exitReason says how the process ended, once done is closed.
func (r *procRunner) exitReason() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ee *exec.ExitError
	switch {
	case r.waitErr == nil:
		return "it exited with status 0"
	case errors.As(r.waitErr, &ee):
		return ee.String() // "signal: killed", "exit status 2"
	}
	return r.waitErr.Error()
}

func (r *procRunner) Kill(context.Context) error {
	if r.killCgroup != nil && r.killCgroup() {
		return nil
	}
	if r.cmd.Process == nil {
		return nil
	}
	if err := r.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (r *procRunner) ID() string                      { return strconv.Itoa(r.pid) }
func (r *procRunner) Name() string                    { return r.name }
func (r *procRunner) Stdout() io.ReadCloser           { return r.stdout }
func (r *procRunner) Stderr() io.ReadCloser           { return r.stderr }
func (r *procRunner) Diagnose(context.Context) string { return "" }

// PluginToHost maps the socket the plugin reports, relative to the directory it
// runs in, to the host's path; it refuses anything that leaves that directory.
func (r *procRunner) PluginToHost(network, addr string) (string, string, error) {
	if network != "unix" {
		return "", "", fmt.Errorf("plugin %s offers %s %s: only a unix socket is accepted", r.name, network, addr)
	}
	rel := strings.TrimPrefix(addr, "./")
	if rel == "" || strings.ContainsAny(rel, "/\x00") || rel == "." || rel == ".." {
		return "", "", fmt.Errorf("plugin %s offers socket %q outside its directory", r.name, addr)
	}
	return "unix", filepath.Join(r.socketDir, rel), nil
}

func (r *procRunner) HostToPlugin(network, addr string) (string, string, error) {
	if network == "unix" && filepath.Dir(addr) == r.socketDir {
		return network, "./" + filepath.Base(addr), nil
	}
	return network, addr, nil
}

// tail keeps the last bytes of what a plugin wrote to stderr, for the error of a
// start that failed before the plugin logged anything (the launcher's own
// refusals). A plugin has no credentials before its first call, so this holds none.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

const tailSize = 2048

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailSize {
		t.buf = t.buf[len(t.buf)-tailSize:]
	}
	return len(p), nil
}

func (t *tail) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.buf)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
