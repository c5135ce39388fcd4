package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/pki"
)

// The shipped site agent's lab: better-compute serve runs in the site agent's own
// namespace on loopback (the site reaches its gateway there, as a one-host site
// would), so that neither needs a route off the namespace.
const (
	serveAPI     = "127.0.0.1:8443"
	serveGateway = "127.0.0.1:8444"
	benchSite    = "bench"
)

// shippedBinaries are the programs the headline mode runs: built from this tree
// by bench/run.sh.
type shippedBinaries struct {
	bcd, betterCompute string
	machines           int
}

// startShipped sets up and starts the real thing, as an operator would: a PKI, a
// control plane, a site, machines registered with boot entry ramdisk, a site
// token, bcd join --role site and bcd site with [boot] on the namespace's veth,
// default logging. bcd site and serve each run in a cgroup of their own, so their
// CPU time is read as the peers' is.
func (l *lab) startShipped(ctx context.Context, bin shippedBinaries, exe string) error {
	t := l.targets[serverSite]
	d := filepath.Join(l.dir, "site")
	for _, sub := range []string{"etc", "data", "cp"} {
		if err := os.MkdirAll(filepath.Join(d, sub), 0o755); err != nil {
			return err
		}
	}
	pkiDir := filepath.Join(d, "pki")
	tokenFile := filepath.Join(d, "operator-token")
	start := time.Now()
	if out, err := exec.Command(bin.betterCompute, "pki", "init", pkiDir).CombinedOutput(); err != nil {
		return fmt.Errorf("better-compute pki init: %v: %s", err, bytes.TrimSpace(out))
	}
	serve := t.ns.Command(bin.betterCompute, "serve", "--pki", pkiDir, "--data", filepath.Join(d, "cp"),
		"--listen", serveAPI, "--gateway-listen", serveGateway, "--operator-token-file", tokenFile)
	if err := l.startPeer(ctx, serverServe, serve, []portCheck{{"tcp", 8443}, {"tcp", 8444}}); err != nil {
		return err
	}
	bc := func(args ...string) (string, error) {
		cmd := t.ns.Command(bin.betterCompute, append(args, "--token-file", tokenFile)...)
		cmd.Env = append(os.Environ(), "BETTER_COMPUTE_SERVER=https://"+serveAPI, "BETTER_COMPUTE_PKI="+pkiDir)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("better-compute %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
		}
		return stdout.String(), nil
	}
	if err := retry(ctx, 30*time.Second, func() error { _, err := bc("sites", "create", benchSite); return err }); err != nil {
		return err
	}
	// The machines, through the operator api the CLI uses, from a helper process
	// in the namespace (serve listens on its loopback): 1,000 runs of
	// `better-compute machines add` would take a minute of this machine's two cores.
	reg := registration{Server: "https://" + serveAPI, TokenFile: tokenFile, PKI: pkiDir, Site: benchSite, Machines: bin.machines}
	spec, _ := json.Marshal(reg)
	cmd := t.ns.Command(exe, "register")
	cmd.Stdin = bytes.NewReader(spec)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("registering %d machines: %v: %s", bin.machines, err, bytes.TrimSpace(out))
	}
	fmt.Fprintf(l.log, "bootbench: serve up, %d machines registered with boot ramdisk in %.1f s\n", bin.machines, time.Since(start).Seconds())

	pins, err := exec.Command(bin.betterCompute, "pki", "pins", pkiDir).Output()
	if err != nil {
		return fmt.Errorf("better-compute pki pins: %w", err)
	}
	url := fmt.Sprintf("http://%s:%d", t.serverIP, httpPort)
	// No [log]: the default level (info), as the unit gives. tftp ":69" as the spec
	// writes it. No [plugins]: no machine has a BMC here.
	cfg := fmt.Sprintf(`gateway_url = "https://%s"
site = %q
%sdata_dir = %q
socket_path = %q

[boot]
listen = "%s:%d"
url = %q
kernel = "%s/ramdisk/vmlinuz"
initrd = "%s/ramdisk/initrd"
cmdline = "console=ttyS0,115200"
server_ip = %q
proxy_dhcp = true
tftp = ":69"
tftp_root = %q
interface = "srv0"
ramdisk_dir = %q
`, serveGateway, benchSite, pins, filepath.Join(d, "data"), filepath.Join(d, "bcd.sock"),
		t.serverIP, httpPort, url, url, url, t.serverIP.String(),
		filepath.Join(l.dir, "tftp"), filepath.Join(l.dir, "ramdisk"))
	conf := filepath.Join(d, "etc", "config.toml")
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(pkiDir, "join-encryption.jwk"), filepath.Join(d, "etc", "join-encryption.jwk")); err != nil {
		return err
	}
	token, err := bc("tokens", "create", "--pool", benchSite, "--site", benchSite, "--role", "site")
	if err != nil {
		return err
	}
	join := t.ns.Command(bin.bcd, "join", "--role", "site", "--config", conf)
	join.Env = append(os.Environ(), "BCD_JOIN_TOKEN="+strings.TrimSpace(token))
	if out, err := join.CombinedOutput(); err != nil {
		return fmt.Errorf("bcd join --role site: %v: %s", err, bytes.TrimSpace(out))
	}
	site := t.ns.CommandSameMounts(bin.bcd, "site", "--config", conf)
	if err := l.startPeer(ctx, serverSite, site, []portCheck{{"udp", 67}, {"udp", 4011}, {"udp", 69}, {"tcp", httpPort}}); err != nil {
		return err
	}
	// Measure only once the site agent has the whole boot table from serve: a
	// machine it does not know is ignored, which would count as lost answers.
	logPath := filepath.Join(l.dir, "logs", serverSite+".log")
	if err := retry(ctx, 60*time.Second, func() error {
		n := appliedEntries(logPath)
		if n < bin.machines {
			return fmt.Errorf("bcd site applied a boot table of %d entries, want %d:\n%s", n, bin.machines, tail(logPath, 15))
		}
		return nil
	}); err != nil {
		return err
	}
	fmt.Fprintf(l.log, "bootbench: bcd site joined and serving %d machines, %.1f s after pki init\n", bin.machines, time.Since(start).Seconds())
	return nil
}

// appliedEntries is the size of the largest boot table bcd site has logged as
// applied ("boot table applied" entries=N, text or JSON).
var entriesRE = regexp.MustCompile(`boot table applied.*?entries"?[=:]\s*(\d+)`)

func appliedEntries(logPath string) int {
	b, _ := os.ReadFile(logPath)
	best := 0
	for _, m := range entriesRE.FindAllSubmatch(b, -1) {
		if n, err := strconv.Atoi(string(m[1])); err == nil && n > best {
			best = n
		}
	}
	return best
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// retry calls fn until it succeeds or timeout passes, returning its last error.
func retry(ctx context.Context, timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// registration is what the coordinator hands `bootbench register`.
type registration struct {
	Server, TokenFile, PKI, Site string
	Machines                     int
}

// runRegister registers the benchmark's machines: benchMAC(0…n-1), named
// bench-NNNN, boot mode ramdisk, every other one UEFI. It runs in the site
// agent's namespace, where serve listens.
func runRegister(stdin io.Reader, stdout io.Writer) error {
	var r registration
	if err := json.NewDecoder(stdin).Decode(&r); err != nil {
		return fmt.Errorf("register: reading the spec: %w", err)
	}
	if r.Machines < 1 || r.Machines > 1<<16 {
		return fmt.Errorf("register: %d machines: want 1 to 65536", r.Machines)
	}
	tok, err := os.ReadFile(r.TokenFile)
	if err != nil {
		return fmt.Errorf("register: operator token: %w", err)
	}
	pub, err := pki.LoadPublic(r.PKI)
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	c, err := client.New(r.Server, strings.TrimSpace(string(tok)), pub.ServingCAPool())
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	next := make(chan int)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				m := benchMAC(i)
				in := apitype.MachineCreate{Site: r.Site, Name: fmt.Sprintf("bench-%04d", i),
					MACs: []string{net.HardwareAddr(m[:]).String()}, BootMode: "ramdisk"}
				if i%2 == 1 {
					in.Firmware = "uefi"
				}
				if _, err := c.CreateMachine(ctx, in); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("machine %s: %w", in.Name, err))
					mu.Unlock()
				}
			}
		})
	}
	for i := range r.Machines {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("register: %d of %d failed, first: %w", len(errs), r.Machines, errs[0])
	}
	_, err = fmt.Fprintf(stdout, "%d machines registered\n", r.Machines)
	return err
}
