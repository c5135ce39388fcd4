package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/better-compute/bcd/internal/syncbuf"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
)

var (
	binDir string
	bcdBin string
	bcBin  string
	// bcdFakeBin is bcd built with -tags fakehw.
	bcdFakeBin string
	buildErr   error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bcd-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	bcdBin = filepath.Join(dir, "bcd")
	bcBin = filepath.Join(dir, "better-compute")
	bcdFakeBin = filepath.Join(dir, "bcd-fakehw")
	for _, b := range []struct{ bin, pkg, tags string }{
		{bcdBin, "../../cmd/bcd", ""}, {bcBin, "../../cmd/better-compute", ""},
		// A fakehw bcd reaches swtpm over TCP (nodekey.EnvTPMTCP); a host build
		// only opens /dev/tpmrm0.
		{bcdFakeBin, "../../cmd/bcd", "fakehw"},
	} {
		bin, pkg := b.bin, b.pkg
		cmd := exec.Command("go", "build", "-tags="+b.tags, "-ldflags", "-X github.com/better-compute/bcd/internal/version.Version=0.0.0-e2e", "-o", bin, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// controlPlane is a running `better-compute serve`.
type controlPlane struct {
	t         *testing.T
	pki, data string
	api, gw   string // host:port
	tokenFile string
	log       *syncbuf.Buffer
	cmd       *exec.Cmd
	done      chan struct{}
	// extra are more serve flags (--cert-lifetime).
	extra []string
}

func newControlPlane(t *testing.T, serveFlags ...string) *controlPlane {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	dir := t.TempDir()
	cp := &controlPlane{t: t, pki: filepath.Join(dir, "pki"), data: filepath.Join(dir, "data"),
		api: freePort(t), gw: freePort(t), tokenFile: filepath.Join(dir, "operator-token"), extra: serveFlags}
	if out, err := exec.Command(bcBin, "pki", "init", cp.pki).CombinedOutput(); err != nil {
		t.Fatalf("pki init: %v\n%s", err, out)
	}
	cp.start()
	t.Cleanup(cp.stop)
	return cp
}

func (cp *controlPlane) start() {
	cp.t.Helper()
	cp.log = &syncbuf.Buffer{}
	cp.cmd = exec.Command(bcBin, "serve", "--pki", cp.pki, "--data", cp.data, "--listen", cp.api,
		"--gateway-listen", cp.gw, "--operator-token-file", cp.tokenFile)
	cp.cmd.Args = append(cp.cmd.Args, cp.extra...)
	pr, pw := io.Pipe()
	cp.cmd.Stdout = io.MultiWriter(cp.log, pw)
	cp.cmd.Stderr = cp.log
	if err := cp.cmd.Start(); err != nil {
		cp.t.Fatal(err)
	}
	cp.done = make(chan struct{})
	go func() { cp.cmd.Wait(); pw.Close(); close(cp.done) }()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		seen := 0
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening on") {
				seen++
				if seen == 2 {
					ready <- true
				}
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			cp.t.Fatalf("better-compute serve exited before listening:\n%s", cp.log)
		}
	case <-time.After(60 * time.Second):
		cp.t.Fatalf("better-compute serve did not say it listens within 60 s:\n%s", cp.log)
	}
}

func (cp *controlPlane) stop() {
	if cp.cmd == nil || cp.cmd.Process == nil {
		return
	}
	select {
	case <-cp.done:
		return
	default:
	}
	cp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-cp.done:
	case <-time.After(15 * time.Second):
		cp.cmd.Process.Kill()
		<-cp.done
	}
}

// bc runs an operator command against this control plane.
func (cp *controlPlane) bc(args ...string) (string, error) {
	cmd := exec.Command(bcBin, args...)
	cmd.Env = append(os.Environ(), "BETTER_COMPUTE_SERVER=https://"+cp.api, "BETTER_COMPUTE_PKI="+cp.pki)
	cmd.Args = append(cmd.Args, "--token-file", cp.tokenFile)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("better-compute %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func (cp *controlPlane) mustBC(args ...string) string {
	cp.t.Helper()
	out, err := cp.bc(args...)
	if err != nil {
		cp.t.Fatalf("%v\nserve log:\n%s", err, cp.log)
	}
	return out
}

func (cp *controlPlane) token(site, role string, extra ...string) string {
	cp.t.Helper()
	out := cp.mustBC(append([]string{"tokens", "create", "--pool", "pool_e2e", "--site", site, "--role", role}, extra...)...)
	tok := strings.TrimSpace(out)
	if !strings.HasPrefix(tok, "bcjt_") || strings.Contains(tok, "\n") {
		cp.t.Fatalf("tokens create printed %q, want one bcjt_ token", out)
	}
	return tok
}

type nodeRow struct {
	ID            string `json:"id"`
	Role          string `json:"role"`
	Site          string `json:"site"`
	State         string `json:"state"`
	Connected     bool   `json:"connected"`
	DaemonVersion string `json:"daemon_version"`
	SessionID     int64  `json:"session_id"`
	Pool          string `json:"pool"`
	// CertNotAfter is the node certificate's expiry as the store has it.
	CertNotAfter time.Time `json:"cert_not_after"`
	// DaemonSection is the node's last report on its daemon section.
	DaemonSection *apitype.SectionStatus `json:"daemon_section"`
}

func (cp *controlPlane) nodes() []nodeRow {
	cp.t.Helper()
	out := cp.mustBC("nodes", "list", "-o", "json")
	var v []nodeRow
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		cp.t.Fatalf("nodes list -o json: %v: %s", err, out)
	}
	return v
}

// waitNode polls nodes list until cond holds for the node.
func (cp *controlPlane) waitNode(id string, timeout time.Duration, what string, cond func(nodeRow) bool) nodeRow {
	cp.t.Helper()
	deadline := time.Now().Add(timeout)
	var last nodeRow
	for time.Now().Before(deadline) {
		for _, n := range cp.nodes() {
			if n.ID == id {
				last = n
				if cond(n) {
					return n
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	cp.t.Fatalf("node %s: not %s within %s (last %+v)\nserve log:\n%s", id, what, timeout, last, cp.log)
	return last
}

// host is one machine's bcd files: config.toml, join-encryption.jwk, data_dir.
type host struct {
	dir, config, data string
}

// newHost writes config.toml the way the install script does, with the control
// plane's pins, and join-encryption.jwk beside it.
func newHost(t *testing.T, cp *controlPlane, site string) host {
	t.Helper()
	dir := t.TempDir()
	h := host{dir: dir, config: filepath.Join(dir, "etc/config.toml"), data: filepath.Join(dir, "data")}
	pins, err := exec.Command(bcBin, "pki", "pins", cp.pki).Output()
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("gateway_url = \"https://%s\"\nsite = %q\n%sdata_dir = %q\nsocket_path = %q\n",
		cp.gw, site, pins, h.data, filepath.Join(dir, "bcd.sock"))
	os.MkdirAll(filepath.Dir(h.config), 0o755)
	if err := os.WriteFile(h.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	jwk, err := os.ReadFile(filepath.Join(cp.pki, "join-encryption.jwk"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(filepath.Dir(h.config), "join-encryption.jwk"), jwk, 0o644)
	return h
}

type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
}

// bcd runs the agent binary with env and stdin, and waits for it.
func bcd(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	return run(t, bcdBin, env, stdin, args...)
}

// run runs bin (bcdBin or bcdFakeBin) with env and stdin, and waits for it.
func run(t *testing.T, bin string, env []string, stdin string, args ...string) result {
	t.Helper()
	return runAs(t, nil, bin, env, stdin, args...)
}

// runAs is run with the process's credentials set (nil: the test's own).
func runAs(t *testing.T, cred *syscall.Credential, bin string, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), "BCD_JOIN_TOKEN="), env...)
	cmd.Stdin = strings.NewReader(stdin)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("bcd %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// agentProcess is a running `bcd node` or `bcd site`.
type agentProcess struct {
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
	done chan struct{}
}

func startAgent(t *testing.T, args ...string) *agentProcess {
	t.Helper()
	return startAgentBin(t, bcdBin, nil, args...)
}

// startAgentBin starts bin with env added to the test's environment.
func startAgentBin(t *testing.T, bin string, env []string, args ...string) *agentProcess {
	t.Helper()
	return startAgentAs(t, nil, bin, env, args...)
}

// startAgentAs is startAgentBin with the process's credentials set (nil: the
// test's own).
func startAgentAs(t *testing.T, cred *syscall.Credential, bin string, env []string, args ...string) *agentProcess {
	t.Helper()
	p := &agentProcess{cmd: exec.Command(bin, args...), log: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	if cred != nil {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(p.stop)
	return p
}

func (p *agentProcess) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

var nodeIDRe = regexp.MustCompile(`n_[a-z0-9]{26}`)

// identityNodeID reads the node id a join wrote.
func identityNodeID(t *testing.T, dataDir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "identity.json"))
	if err != nil {
		t.Fatalf("identity.json: %v", err)
	}
	var v struct {
		NodeID string `json:"node_id"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.NodeID == "" {
		t.Fatalf("identity.json without node_id: %v %s", err, b)
	}
	return v.NodeID
}
