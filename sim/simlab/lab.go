// Package simlab sets up what a bcd sim run plays against, for tests and
// benchmarks: two network namespaces joined by a veth (the site's, holding
// better-compute serve and bcd site on the boot network's 10.77.0.2, and sim's,
// holding 10.77.0.3 for the simulated BMCs and the image, and one address per
// machine from 10.77.1.0), a control plane with a site, the site agent joined and
// running with its boot servers and the real bcx-ipmi plugin, and the bcd sim
// binary run in sim's namespace. Nothing is bound outside the two namespaces.
//
// It is apart from package sim because it starts processes and links the
// testbed; the bcd binary links only sim.
package simlab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/internal/spawn"
	"github.com/better-compute/bcd/internal/syncbuf"
	"github.com/better-compute/bcd/sim"
	"github.com/better-compute/bcd/testbed"
)

// The lab's addresses.
const (
	SiteIP    = "10.77.0.2" // bcd site's boot servers, serve's api and gateway
	SimIP     = "10.77.0.3" // sim: the simulated BMCs and the image server
	FirstIP   = "10.77.1.0" // machine 0; machine i is this plus i
	apiAddr   = SiteIP + ":8443"
	gwAddr    = SiteIP + ":8444"
	bootHTTP  = SiteIP + ":8080"
	siteName  = "simlab"
	maxFleet  = 16000 // 10.77.1.0 … 10.77.63.255
	prefixLen = 16
)

// Binaries are the programs the lab runs.
type Binaries struct {
	Bcd, BetterCompute, BcxIPMI string
}

// Lab is a running control plane and site agent, and sim's namespace.
type Lab struct {
	Dir string
	Bin Binaries
	// KernelSize and InitrdSize are the sizes of the (synthetic) ramdisk kernel and
	// initrd the site serves: sim reads them whole and boots nothing, so their
	// bytes are random, and small enough for a thousand machines on two cores.
	KernelSize, InitrdSize int64
	// Log receives the lab's and sim's log lines; nil discards them.
	Log io.Writer
	// Progress, when set, receives sim's progress lines (sim.Progress, every
	// sim.ProgressInterval) even when Log is nil.
	Progress io.Writer
	// MetricsServe and MetricsSite, when set, are host:port (on SiteIP) where
	// serve (--metrics-listen) and bcd site ([metrics] listen) serve
	// /metrics; Metrics scrapes them.
	MetricsServe, MetricsSite string
	// CheckNeighbors leaves [boot] trust_any_neighbor off: the site agent
	// then checks every client against its neighbour table, which sim's
	// machines (one interface, one MAC) do not pass.
	CheckNeighbors bool

	site, simNS      *testbed.Netns
	serve, siteAgent *testbed.Process
	pki, tokenFile   string
	// restoreNeigh puts back the host's neighbour-table limits Start raised.
	restoreNeigh func()
	siteConf     string
	addrs        int
}

func (l *Lab) logf(format string, args ...any) {
	if l.Log != nil {
		fmt.Fprintf(l.Log, "%s lab: %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
	}
}

// Start builds the namespaces, starts serve and the site agent, and gives sim's
// namespace the addresses of machines machines.
func (l *Lab) Start(ctx context.Context, machines int) (err error) {
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	if machines > maxFleet {
		return fmt.Errorf("simlab: %d machines: at most %d", machines, maxFleet)
	}
	if l.KernelSize == 0 {
		l.KernelSize = 1 << 20
	}
	if l.InitrdSize == 0 {
		l.InitrdSize = 2 << 20
	}
	// Raised before the namespaces exist: the table is the host's (neighDefault).
	restore, changed, err := raiseNeighbourLimits(neighDefault, machines)
	if err != nil {
		return err
	}
	l.restoreNeigh = restore
	if changed != "" {
		l.logf("neighbour table for %d machines: %s", machines, changed)
	}
	id := os.Getpid() % 100000
	if l.site, err = testbed.NewNetns(fmt.Sprintf("bcdsimsite%d", id)); err != nil {
		return err
	}
	if l.simNS, err = testbed.NewNetns(fmt.Sprintf("bcdsim%d", id)); err != nil {
		return err
	}
	if err := testbed.Veth(l.site, "boot0", fmt.Sprintf("%s/%d", SiteIP, prefixLen), l.simNS, "sim0", fmt.Sprintf("%s/%d", SimIP, prefixLen)); err != nil {
		return err
	}
	// The limited broadcast (a DISCOVER to 255.255.255.255) needs a route.
	if err := l.simNS.Run("ip", "route", "add", "default", "dev", "sim0"); err != nil {
		return err
	}
	if err := l.addAddrs(machines); err != nil {
		return err
	}
	for _, d := range []string{"logs", "run"} {
		os.MkdirAll(filepath.Join(l.Dir, d), 0o755)
	}
	if err := l.startServe(ctx); err != nil {
		return err
	}
	return l.startSite(ctx)
}

// addAddrs adds machine addresses to sim0 up to n, in one ip -batch.
func (l *Lab) addAddrs(n int) error {
	if n <= l.addrs {
		return nil
	}
	var b bytes.Buffer
	for i := l.addrs; i < n; i++ {
		fmt.Fprintf(&b, "addr add 10.77.%d.%d/%d dev sim0 noprefixroute\n", 1+i/256, i%256, prefixLen)
	}
	cmd := l.simNS.Command("ip", "-batch", "-")
	cmd.Stdin = &b
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("simlab: machine addresses: %v: %s", err, out)
	}
	l.addrs = n
	return nil
}

// BC runs an operator command.
func (l *Lab) BC(args ...string) (string, error) {
	return testbed.RunBC(l.site, l.Bin.BetterCompute, "https://"+apiAddr, l.pki, l.tokenFile, args...)
}

func (l *Lab) startServe(ctx context.Context) error {
	l.pki = filepath.Join(l.Dir, "pki")
	l.tokenFile = filepath.Join(l.Dir, "operator-token")
	if out, err := exec.Command(l.Bin.BetterCompute, "pki", "init", l.pki).CombinedOutput(); err != nil {
		return fmt.Errorf("simlab: pki init: %v: %s", err, out)
	}
	if err := l.StartServe(ctx); err != nil {
		return err
	}
	_, err := l.BC("sites", "create", siteName)
	return err
}

// StartServe starts better-compute serve (again, on the same data).
func (l *Lab) StartServe(ctx context.Context) error {
	args := []string{"serve", "--pki", l.pki, "--data", filepath.Join(l.Dir, "cp"),
		"--listen", apiAddr, "--gateway-listen", gwAddr, "--operator-token-file", l.tokenFile}
	if l.MetricsServe != "" {
		args = append(args, "--metrics-listen", l.MetricsServe)
	}
	cmd := l.site.Command(l.Bin.BetterCompute, args...)
	var err error
	if l.serve, err = testbed.StartProcess("better-compute serve", cmd, filepath.Join(l.Dir, "logs", "serve.log")); err != nil {
		return err
	}
	os.WriteFile(filepath.Join(l.Dir, "run", "serve.pid"), []byte(strconv.Itoa(l.serve.PID())), 0o644)
	if err := poll(ctx, 60*time.Second, func() bool {
		if _, err := os.Stat(l.tokenFile); err != nil {
			return false
		}
		_, err := l.BC("sites", "list")
		return err == nil
	}); err != nil {
		return fmt.Errorf("simlab: better-compute serve did not start: %w\n%s", err, l.serve.Tail(30))
	}
	l.logf("serve: api https://%s, gateway https://%s (pid %d)", apiAddr, gwAddr, l.serve.PID())
	return nil
}

// RestartServe stops serve (SIGTERM) and starts it again on the same data.
func (l *Lab) RestartServe(ctx context.Context) error {
	l.serve.Stop(20 * time.Second)
	return l.StartServe(ctx)
}

func (l *Lab) startSite(ctx context.Context) error {
	dir := filepath.Join(l.Dir, "site")
	for _, d := range []string{"etc", "data", "tftp", "ramdisk", "plugins"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	// The boot files: Debian's iPXE where installed (sim does not run them), else
	// stand-ins of a plausible size.
	for _, b := range []string{"undionly.kpxe", "ipxe.efi", "snponly.efi"} {
		dst := filepath.Join(dir, "tftp", b)
		if err := copyFile("/usr/lib/ipxe/"+b, dst); err != nil {
			if err := randomFile(dst, 96<<10); err != nil {
				return err
			}
		}
	}
	if err := randomFile(filepath.Join(dir, "ramdisk", "vmlinuz"), l.KernelSize); err != nil {
		return err
	}
	if err := randomFile(filepath.Join(dir, "ramdisk", "initrd"), l.InitrdSize); err != nil {
		return err
	}
	plugin := filepath.Join(dir, "plugins", "bcx-ipmi")
	if err := copyFile(l.Bin.BcxIPMI, plugin); err != nil {
		return err
	}
	os.Chmod(plugin, 0o755)
	sum, err := fileSHA256(plugin)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "plugins", "pins"), []byte(sum+"  bcx-ipmi\n"), 0o644); err != nil {
		return err
	}
	pins, err := exec.Command(l.Bin.BetterCompute, "pki", "pins", l.pki).Output()
	if err != nil {
		return err
	}
	l.siteConf = filepath.Join(dir, "etc", "config.toml")
	// The simulated machines share one interface, so one MAC: the neighbour
	// table cannot tell them apart.
	trustAny := "trust_any_neighbor = true\n"
	if l.CheckNeighbors {
		trustAny = ""
	}
	cfg := fmt.Sprintf(`gateway_url = "https://%s"
site = %q
%sdata_dir = %q
socket_path = %q

[log]
level = "error"

[boot]
listen = %q
url = "http://%s"
server_ip = %q
proxy_dhcp = true
tftp = "%s:69"
tftp_root = %q
interface = "boot0"
ramdisk_dir = %q
%s
[plugins]
dir = %q
`, gwAddr, siteName, pins, filepath.Join(dir, "data"), filepath.Join(dir, "bcd.sock"),
		bootHTTP, bootHTTP, SiteIP, SiteIP, filepath.Join(dir, "tftp"), filepath.Join(dir, "ramdisk"), trustAny, filepath.Join(dir, "plugins"))
	if l.MetricsSite != "" {
		cfg += fmt.Sprintf("\n[metrics]\nlisten = %q\n", l.MetricsSite)
	}
	if err := os.WriteFile(l.siteConf, []byte(cfg), 0o600); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(l.pki, "join-encryption.jwk"), filepath.Join(dir, "etc", "join-encryption.jwk")); err != nil {
		return err
	}
	token, err := l.BC("tokens", "create", "--pool", "simlab", "--site", siteName, "--role", "site")
	if err != nil {
		return err
	}
	join := l.site.Command(l.Bin.Bcd, "join", "--role", "site", "--config", l.siteConf)
	join.Env = append(os.Environ(), "BCD_JOIN_TOKEN="+strings.TrimSpace(token))
	if out, err := join.CombinedOutput(); err != nil {
		return fmt.Errorf("simlab: bcd join --role site: %v: %s", err, out)
	}
	return l.StartSite(ctx)
}

// StartSite starts bcd site (again) and waits until its session is up.
func (l *Lab) StartSite(ctx context.Context) error {
	var err error
	if l.siteAgent, err = testbed.StartProcess("bcd site", l.site.CommandSameMounts(l.Bin.Bcd, "site", "--config", l.siteConf),
		filepath.Join(l.Dir, "logs", "site.log")); err != nil {
		return err
	}
	os.WriteFile(filepath.Join(l.Dir, "run", "site.pid"), []byte(strconv.Itoa(l.siteAgent.PID())), 0o644)
	if err := poll(ctx, 60*time.Second, func() bool {
		out, _ := l.BC("nodes", "list", "-o", "json")
		var nodes []struct {
			Role      string `json:"role"`
			Connected bool   `json:"connected"`
		}
		json.Unmarshal([]byte(out), &nodes)
		for _, n := range nodes {
			if n.Role == "site" && n.Connected {
				return true
			}
		}
		return false
	}); err != nil {
		return fmt.Errorf("simlab: bcd site did not connect: %w\n%s", err, l.siteAgent.Tail(30))
	}
	l.logf("site: boot servers on %s (pid %d)", SiteIP, l.siteAgent.PID())
	return nil
}

// RestartSite stops bcd site (SIGTERM) and starts it again.
func (l *Lab) RestartSite(ctx context.Context) error {
	l.siteAgent.Stop(20 * time.Second)
	return l.StartSite(ctx)
}

// Options are a sim run's.
type Options struct {
	Machines  int
	Name      string        // machine name prefix (default sim)
	ImageSize int64         // default sim's
	Timeout   time.Duration // default 20 minutes
	// Faults run during the run, from the lab's side (RestartServe, RestartSite).
	Faults []sim.Fault
	// Extra are more bcd sim flags.
	Extra []string
}

// ErrNotOK is returned with the result of a run whose machines did not all end
// provisioned with complete timelines.
var ErrNotOK = errors.New("simlab: not every machine was provisioned with a complete timeline")

// Run runs the bcd sim binary in sim's namespace and returns its result; its
// stdout and stderr go to Log. The error is ErrNotOK (with the result) when sim
// exited 1 with a result.
func (l *Lab) Run(ctx context.Context, o Options) (*sim.Result, error) {
	if err := l.addAddrs(o.Machines); err != nil {
		return nil, err
	}
	if o.Name == "" {
		o.Name = "sim"
	}
	jsonOut := filepath.Join(l.Dir, "run", o.Name+"-result.json")
	os.Remove(jsonOut)
	args := []string{"sim", "--site-config", l.siteConf, "--api", "https://" + apiAddr,
		"--operator-token-file", l.tokenFile, "--machines", strconv.Itoa(o.Machines),
		"--first-ip", FirstIP, "--bmc-address", SimIP, "--work-dir", filepath.Join(l.Dir, "machines-"+o.Name),
		"--name", o.Name, "--json", jsonOut,
		"--watch", "serve=" + filepath.Join(l.Dir, "run", "serve.pid"),
		"--watch", "site=" + filepath.Join(l.Dir, "run", "site.pid")}
	if o.ImageSize > 0 {
		args = append(args, "--image-size", strconv.FormatInt(o.ImageSize, 10))
	}
	if o.Timeout > 0 {
		args = append(args, "--timeout", o.Timeout.String())
	}
	args = append(args, o.Extra...)
	cmd := l.simNS.CommandSameMounts(l.Bin.Bcd, args...)
	var w io.Writer = io.Discard
	if l.Log != nil {
		w = l.Log
	}
	if l.Progress != nil {
		w = &progressTee{all: w, progress: l.Progress}
	}
	// sim's last words, for the error when it ends without a result.
	last := &syncbuf.Tail{Max: 4 << 10}
	w = io.MultiWriter(w, last)
	cmd.Stdout, cmd.Stderr = w, w
	// Killed with the process that runs the lab, like serve and the site agent.
	if err := spawn.StartKilledWithUs(cmd); err != nil {
		return nil, err
	}
	waitDone := make(chan error, 1)
	go func() { waitDone <- cmd.Wait() }()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	faultErr := make(chan error, len(o.Faults))
	var faultMu sync.Mutex
	var done []string
	runStart := time.Now()
	for _, f := range o.Faults {
		go func() {
			select {
			case <-fctx.Done():
				faultErr <- nil
				return
			case <-time.After(f.After):
			}
			l.logf("fault: %s", f.Name)
			at := time.Since(runStart)
			err := f.Do(fctx)
			msg := fmt.Sprintf("%s at +%s (sim started at +0), took %s", f.Name, at.Round(100*time.Millisecond), (time.Since(runStart) - at).Round(100*time.Millisecond))
			if err != nil {
				err = fmt.Errorf("fault %s: %w", f.Name, err)
				msg += ": " + err.Error()
			}
			faultMu.Lock()
			done = append(done, msg)
			faultMu.Unlock()
			faultErr <- err
		}()
	}
	var werr error
	select {
	case werr = <-waitDone:
	case <-ctx.Done():
		// sim prints what it has and exits; one that does not within a minute
		// is killed.
		cmd.Process.Signal(os.Interrupt)
		select {
		case werr = <-waitDone:
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			werr = <-waitDone
		}
	}
	cancel()
	for range o.Faults {
		if err := <-faultErr; err != nil && werr == nil {
			werr = err
		}
	}
	b, rerr := os.ReadFile(jsonOut)
	if rerr != nil {
		return nil, fmt.Errorf("simlab: bcd sim: %v (no result: %v); its output ended:\n%s", werr, rerr, last.String())
	}
	var r sim.Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("simlab: %s: %w", jsonOut, err)
	}
	r.Faults = append(r.Faults, done...)
	var ee *exec.ExitError
	if errors.As(werr, &ee) && ee.ExitCode() == 1 {
		return &r, ErrNotOK
	}
	return &r, werr
}

// progressTee writes everything to all and the lines that hold sim.Progress to
// progress too. os/exec copies the child's output from one goroutine.
type progressTee struct {
	all, progress io.Writer
	line          []byte
}

func (t *progressTee) Write(p []byte) (int, error) {
	t.all.Write(p)
	t.line = append(t.line, p...)
	for {
		i := bytes.IndexByte(t.line, '\n')
		if i < 0 {
			break
		}
		if bytes.Contains(t.line[:i], []byte(sim.Progress)) {
			t.progress.Write(t.line[:i+1])
		}
		t.line = t.line[i+1:]
	}
	if len(t.line) > 64<<10 {
		t.line = t.line[:0]
	}
	return len(p), nil
}

// Metrics GETs http://addr/metrics from inside the lab's namespace (where serve
// and the site agent listen) and returns the exposition.
func (l *Lab) Metrics(addr string) ([]byte, error) {
	return scrapeMetrics(l.site, addr)
}

// scrapeMetrics GETs http://addr/metrics from inside ns.
func scrapeMetrics(ns *testbed.Netns, addr string) ([]byte, error) {
	var body []byte
	err := ns.Do(func() error {
		// Dialled on this goroutine, whose thread is in the namespace; an
		// http.Client would dial from another.
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.0\r\nHost: "+addr+"\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET http://%s/metrics: %s", addr, resp.Status)
		}
		body, err = io.ReadAll(resp.Body)
		return err
	})
	return body, err
}

// Diagnostics are the services' log tails.
func (l *Lab) Diagnostics() string {
	var b strings.Builder
	for _, p := range []*testbed.Process{l.serve, l.siteAgent} {
		if p != nil {
			b.WriteString(p.Tail(40))
		}
	}
	return b.String()
}

// BC's environment for a caller that runs better-compute itself.
func (l *Lab) Events(machine string) string {
	out, err := l.BC("machines", "events", machine)
	if err != nil {
		return err.Error()
	}
	return out
}

// Close stops the services by PID and deletes the namespaces.
func (l *Lab) Close() {
	if l.siteAgent != nil {
		l.siteAgent.Stop(15 * time.Second)
	}
	if l.serve != nil {
		l.serve.Stop(15 * time.Second)
	}
	for _, ns := range []*testbed.Netns{l.simNS, l.site} {
		if ns != nil {
			ns.Close()
		}
	}
	if l.restoreNeigh != nil {
		l.restoreNeigh()
	}
}

func poll(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("timed out")
		case <-time.After(300 * time.Millisecond):
		}
	}
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

func randomFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyN(f, rand.Reader, size)
	return err
}

func fileSHA256(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}
