package site_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"github.com/better-compute/bcd/internal/syncbuf"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/pin/tftp/v3"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/site"
)

const (
	macA = "52:54:00:12:34:56" // ramdisk
	macB = "52:54:00:12:34:57" // local
	macU = "52:54:00:99:99:99" // no entry
)

// recorder is the fake gateway's side of the sessions: it keeps every frame the
// site sends, acknowledges statuses and events, and can push frames to the site.
type recorder struct {
	mu     sync.Mutex
	frames []protocol.Frame
	conn   *agenttest.Conn
	ctx    context.Context
}

func (r *recorder) session(ctx context.Context, c *agenttest.Conn) {
	if c.Hello.Role != protocol.RoleSite {
		agenttest.AckAll(ctx, c, nil)
		return
	}
	r.mu.Lock()
	r.conn, r.ctx = c, ctx
	r.mu.Unlock()
	agenttest.AckAll(ctx, c, func(f protocol.Frame) {
		r.mu.Lock()
		r.frames = append(r.frames, f)
		r.mu.Unlock()
	})
}

func (r *recorder) send(t *testing.T, typ string, v any) {
	t.Helper()
	r.mu.Lock()
	c, ctx := r.conn, r.ctx
	r.mu.Unlock()
	if c == nil {
		t.Fatal("no session to send to")
	}
	if err := c.Send(ctx, typ, v); err != nil {
		t.Fatal(err)
	}
}

// events returns the events of kind received so far, in order.
func (r *recorder) events(kind string) []protocol.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []protocol.Event
	for _, f := range r.frames {
		var ev protocol.Event
		if f.Type == protocol.FrameEvent && f.Decode(&ev) == nil && ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

func (r *recorder) status(cmdID, state string) *protocol.Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range r.frames {
		var st protocol.Status
		if f.Type == protocol.FrameStatus && f.Decode(&st) == nil && st.CommandID == cmdID && st.State == state {
			return &st
		}
	}
	return nil
}

type fixture struct {
	g        *agenttest.Gateway
	rec      *recorder
	dataDir  string
	cfgPath  string
	cfg      *config.Config
	spec     protocol.Spec
	specMu   sync.Mutex
	dhcpCli  *net.UDPConn
	rootDir  string
	httpAddr string
}

func freePort(t *testing.T, network string) string {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().String()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func section(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func bootSpec(t *testing.T, rev int64) protocol.Spec {
	return protocol.Spec{Revision: rev, Sections: map[string]json.RawMessage{
		protocol.SectionBoot: section(t, protocol.BootSection{Entries: []protocol.BootEntry{
			{MAC: macA, Mode: protocol.BootRamdisk, Cmdline: "quiet"},
			{MAC: macB, Mode: protocol.BootLocal},
		}}),
	}}
}

// newFixture makes a site identity, a config.toml (with bootSection appended when
// it is not empty) and a gateway that welcomes the site with f.spec.
func newFixture(t *testing.T, role string, withBoot bool) *fixture {
	t.Helper()
	f := &fixture{g: agenttest.New(t), rec: &recorder{}, dataDir: filepath.Join(t.TempDir(), "data"), rootDir: t.TempDir()}
	f.g.Identity(t, f.dataDir, role, "site_a")
	f.g.OnSession = f.rec.session
	f.g.WelcomeFor = func(protocol.Hello) protocol.Welcome {
		f.specMu.Lock()
		spec := f.spec
		f.specMu.Unlock()
		return protocol.Welcome{ServerTime: time.Now().UTC(), MinProtocolVersion: protocol.MinVersion, NodeState: protocol.NodeReady, Spec: &spec}
	}
	f.cfgPath = f.g.WriteConfig(t, t.TempDir(), f.dataDir)
	if withBoot {
		for name, data := range map[string]string{"vmlinuz": "KERNEL", "initrd": "INITRD", "undionly.kpxe": "IPXE-BIOS"} {
			if err := os.WriteFile(filepath.Join(f.rootDir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		f.httpAddr = freePort(t, "tcp")
		boot := fmt.Sprintf(`
[boot]
listen = %q
url = "http://%s"
cmdline = "console=ttyS0,115200"
ramdisk_dir = %q
server_ip = "127.0.0.1"
proxy_dhcp = true
tftp = %q
tftp_root = %q
# Every client here is this host (loopback): no neighbour table to check.
trust_any_neighbor = true
`, f.httpAddr, f.httpAddr, f.rootDir, freePort(t, "udp"), f.rootDir)
		appendFile(t, f.cfgPath, boot)
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		f.dhcpCli = c
	}
	f.cfg = loadConfig(t, f.cfgPath)
	return f
}

func appendFile(t *testing.T, path, s string) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) setSpec(s protocol.Spec) {
	f.specMu.Lock()
	f.spec = s
	f.specMu.Unlock()
}

func loadConfig(t *testing.T, path string) *config.Config {
	t.Helper()
	cfg, err := config.Load(path, config.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// newSite is a Site for f's configuration with test timings and a captured log.
func newSite(f *fixture) (*site.Site, *syncbuf.Buffer) {
	log := &syncbuf.Buffer{}
	return &site.Site{
		Config:  f.cfg,
		Logger:  slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		BootID:  func() (string, error) { return "boot-1", nil },
		Claims:  func(context.Context) protocol.Claims { return protocol.Claims{Hostname: "site-host"} },
		Backoff: agent.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
	}, log
}

// start runs a Site ("a process") until the test ends or stop is called.
func (f *fixture) start(t *testing.T, tune func(*site.Site)) (s *site.Site, log *syncbuf.Buffer, stop func() error) {
	t.Helper()
	s, log = newSite(f)
	if f.dhcpCli != nil {
		s.DHCPAddr, s.PXEAddr = "127.0.0.1:0", "127.0.0.1:0"
		s.DHCPBroadcast = f.dhcpCli.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	if tune != nil {
		tune(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Error("Run did not return")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	if f.cfg.Boot != nil {
		waitFor(t, "the boot server", func() bool {
			select {
			case err := <-done:
				t.Fatalf("Run: %v\n%s", err, log.String())
			default:
			}
			return s.Addrs().HTTP.IsValid()
		})
	}
	return s, log, stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (f *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + f.httpAddr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// kernelArgs returns the kernel line's URL and its name=value arguments.
func kernelArgs(t *testing.T, script string) (string, map[string]string) {
	t.Helper()
	for _, line := range strings.Split(script, "\n") {
		if w := strings.Fields(line); len(w) > 1 && w[0] == "kernel" {
			args := map[string]string{}
			for _, a := range w[2:] {
				if a == "||" {
					break
				}
				k, v, _ := strings.Cut(a, "=")
				args[k] = v
			}
			return w[1], args
		}
	}
	t.Fatalf("no kernel line in\n%s", script)
	return "", nil
}

// discover sends a PXE DHCPDISCOVER for mac to the site's port 67 and returns the
// answer, or nil after wait.
func (f *fixture) discover(t *testing.T, s *site.Site, mac string, wait time.Duration) *dhcpv4.DHCPv4 {
	t.Helper()
	hw, _ := net.ParseMAC(mac)
	p, err := dhcpv4.New(
		dhcpv4.WithHwAddr(hw),
		dhcpv4.WithMessageType(dhcpv4.MessageTypeDiscover),
		dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte("PXEClient:Arch:00000:UNDI:002001")),
		dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, []byte{0, 0}),
		dhcpv4.WithGeneric(dhcpv4.OptionClientNetworkInterfaceIdentifier, []byte{1, 2, 1}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.dhcpCli.WriteToUDPAddrPort(p.ToBytes(), s.Addrs().DHCP); err != nil {
		t.Fatal(err)
	}
	f.dhcpCli.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 1500)
	for {
		n, _, err := f.dhcpCli.ReadFromUDPAddrPort(buf)
		if err != nil {
			return nil
		}
		reply, err := dhcpv4.FromBytes(buf[:n])
		if err == nil && reply.TransactionID == p.TransactionID {
			return reply
		}
	}
}

// TestBootFromWelcomeSpec: the boot table arrives in the Welcome; the site renders
// the ramdisk script with every bcd.* parameter and a nonce whose boot.nonce event
// reaches the gateway ahead of the script's own machine.booted event; a local entry
// boots the disk; a MAC without an entry gets the "unknown" script and no DHCP
// answer; DHCP, TFTP, script and kernel are reported as machine.booted.
func TestBootFromWelcomeSpec(t *testing.T) {
	f := newFixture(t, protocol.RoleSite, true)
	f.setSpec(bootSpec(t, 3))
	s, log, _ := f.start(t, nil)
	waitFor(t, "the boot table", func() bool {
		code, body := f.get(t, "/ipxe/"+macB+".ipxe")
		return code == 200 && strings.Contains(body, "sanboot")
	})

	if reply := f.discover(t, s, macA, 2*time.Second); reply == nil || reply.MessageType() != dhcpv4.MessageTypeOffer || reply.BootFileName != "undionly.kpxe" {
		t.Errorf("DHCP for %s: %v", macA, reply)
	}
	if reply := f.discover(t, s, macU, 300*time.Millisecond); reply != nil {
		t.Errorf("DHCP answered a MAC without an entry: %s", reply.Summary())
	}
	code, script := f.get(t, "/ipxe/"+macA+".ipxe")
	if code != 200 {
		t.Fatalf("ramdisk script: %d %s", code, script)
	}
	kernel, args := kernelArgs(t, script)
	if kernel != "http://"+f.httpAddr+"/ramdisk/vmlinuz" || !strings.Contains(script, "initrd --name initrd http://"+f.httpAddr+"/ramdisk/initrd") {
		t.Errorf("kernel and initrd are not the [boot] defaults:\n%s", script)
	}
	want := map[string]string{
		"console":                         "ttyS0,115200",
		"quiet":                           "",
		protocol.CmdlineGatewayURL:        f.g.URL,
		protocol.CmdlineServerName:        "127.0.0.1",
		protocol.CmdlineSite:              "fsn1",
		protocol.CmdlineServingCAPin:      f.g.Pins.ServingCA,
		protocol.CmdlineJoinSigningPin:    f.g.Pins.JoinSigning,
		protocol.CmdlineJoinEncryptionPin: f.g.Pins.JoinEncryption,
	}
	for k, v := range want {
		if got, ok := args[k]; !ok || got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	// 128 random bits, the MAC, the expiry and a tag under witness.key,
	// base64url (witnessnonce.go).
	nonce := args[protocol.CmdlineBootNonce]
	if raw, err := base64.RawURLEncoding.DecodeString(nonce); err != nil || len(raw) != 46 || net.HardwareAddr(raw[16:22]).String() != macA {
		t.Errorf("boot nonce %q is not a keyed nonce for %s (%v)", nonce, macA, err)
	}
	if _, ok := args[protocol.CmdlineProxy]; ok {
		t.Error("bcd.proxy without an http_proxy section")
	}
	if code, body := f.get(t, "/ramdisk/vmlinuz"); code != 200 || body != "KERNEL" {
		t.Errorf("kernel: %d %q", code, body)
	}
	// TFTP carries no MAC: it is the MAC's last seen from the same address (here the
	// script's), as when a machine loops back through its firmware.
	cli, err := tftp.NewClient(s.Addrs().TFTP.String())
	if err != nil {
		t.Fatal(err)
	}
	wt, err := cli.Receive("undionly.kpxe", "octet")
	if err != nil {
		t.Fatalf("TFTP: %v", err)
	}
	var got bytes.Buffer
	if _, err := wt.WriteTo(&got); err != nil || got.String() != "IPXE-BIOS" {
		t.Errorf("TFTP: %q %v", got.String(), err)
	}

	// On the wire: the nonce, then the script that carried it.
	waitFor(t, "the boot.nonce event", func() bool { return len(f.rec.events(protocol.EventBootNonce)) > 0 })
	nonceEv := f.rec.events(protocol.EventBootNonce)[0]
	var bn protocol.BootNonce
	if err := json.Unmarshal(nonceEv.Data, &bn); err != nil {
		t.Fatal(err)
	}
	if bn.MAC != macA || bn.Nonce != nonce || bn.ExpiresAt.Sub(nonceEv.Time) != protocol.BootNonceLifetime {
		t.Errorf("boot.nonce %+v, want MAC %s, the script's nonce, machine m_a, 30 min", bn, macA)
	}
	stagesOf := func() map[string]protocol.Event {
		out := map[string]protocol.Event{}
		for _, ev := range f.rec.events(protocol.EventMachineBooted) {
			var mb protocol.MachineBooted
			if json.Unmarshal(ev.Data, &mb) == nil && mb.MAC == macA {
				out[mb.Stage] = ev
			}
		}
		return out
	}
	waitFor(t, "machine.booted for dhcp, tftp, script and kernel", func() bool {
		return len(stagesOf()) == 4
	})
	st := stagesOf()
	for _, stage := range []string{protocol.StageDHCP, protocol.StageTFTP, protocol.StageScript, protocol.StageKernel} {
		if _, ok := st[stage]; !ok {
			t.Errorf("no machine.booted for stage %s (have %v)", stage, st)
		}
	}
	if st[protocol.StageScript].Seq <= nonceEv.Seq {
		t.Errorf("the script's event (seq %d) came before its nonce's (seq %d)", st[protocol.StageScript].Seq, nonceEv.Seq)
	}
	var mb protocol.MachineBooted
	json.Unmarshal(st[protocol.StageDHCP].Data, &mb)
	if mb.MAC != macA || mb.File != "undionly.kpxe" {
		t.Errorf("dhcp event %+v", mb)
	}
	if code, body := f.get(t, "/ipxe/"+macU+".ipxe"); code != 200 || !strings.Contains(body, "has no boot entry") {
		t.Errorf("unknown MAC: %d\n%s", code, body)
	}
	status := statusOf(t, f.cfg.SocketPath)
	if status.Role != protocol.RoleSite || status.NodeID != "site_a" || status.State != protocol.NodeReady || !status.Connected ||
		status.SpecRevision != 3 || status.BootEntries != 2 || status.HTTP != f.httpAddr || status.DHCP == "" || status.TFTP == "" || status.Proxy != "" {
		t.Errorf("status %+v", status)
	}
	if strings.Contains(log.String(), nonce) {
		t.Error("the boot nonce is in the log")
	}
}

// TestSpecSurvivesRestartWithGatewayDown: the spec received is kept in
// site-spec.json (without BMC passwords, which go to bmc-hosts.json only,
// sealed under bmc-hosts.key, all 0600), and a site agent started while the gateway is down boots from it.
func TestSpecSurvivesRestartWithGatewayDown(t *testing.T) {
	f := newFixture(t, protocol.RoleSite, true)
	spec := bootSpec(t, 5)
	spec.Sections[protocol.SectionBMCHosts] = section(t, protocol.BMCHostsSection{Hosts: []protocol.BMCHost{
		{Machine: "m_a", Address: "10.20.1.10", Username: "admin", Password: "hunter2hunter2"},
	}})
	f.setSpec(spec)
	_, log, stop := f.start(t, nil)
	specPath := filepath.Join(f.dataDir, site.SpecFile)
	waitFor(t, "site-spec.json", func() bool { _, err := os.Stat(specPath); return err == nil })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, name := range []string{site.SpecFile, "bmc-hosts.json", "bmc-hosts.key"} {
		fi, err := os.Stat(filepath.Join(f.dataDir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v", name, err, fi.Mode())
		}
	}
	b, _ := os.ReadFile(specPath)
	if bytes.Contains(b, []byte("hunter2")) {
		t.Error("site-spec.json holds a BMC password")
	}
	if b, _ := os.ReadFile(filepath.Join(f.dataDir, "bmc-hosts.json")); !bytes.Contains(b, []byte("10.20.1.10")) || bytes.Contains(b, []byte("hunter2")) {
		t.Errorf("bmc-hosts.json, want the host and no password in the clear: %s", b)
	}
	if strings.Contains(log.String(), "hunter2") {
		t.Error("a BMC password is in the log")
	}

	f.g.Server.Close()
	s, _, _ := f.start(t, nil)
	code, script := f.get(t, "/ipxe/"+macA+".ipxe")
	if code != 200 || !strings.Contains(script, "bcd.boot_nonce=") {
		t.Errorf("with the gateway down: %d\n%s", code, script)
	}
	if reply := f.discover(t, s, macA, 2*time.Second); reply == nil {
		t.Error("with the gateway down: no DHCP answer")
	}
}

// TestHTTPProxyFromSpec: the http_proxy section starts the proxy, which forwards to
// the allowed destinations and the gateway and refuses the rest; its URL goes onto
// the ramdisk command line; a spec without the section stops it.
func TestHTTPProxyFromSpec(t *testing.T) {
	f := newFixture(t, protocol.RoleSite, true)
	images := newOrigin(t, "image")
	other := newOrigin(t, "other")
	proxyAddr := freePort(t, "tcp")
	spec := bootSpec(t, 1)
	spec.Sections[protocol.SectionHTTPProxy] = section(t, protocol.HTTPProxySection{Listen: proxyAddr, Allow: []string{images}})
	f.setSpec(spec)
	s, _, _ := f.start(t, nil)
	waitFor(t, "the proxy", func() bool { return s.Addrs().Proxy.IsValid() })

	// The proxy listens (Addrs) a moment before the scripts name it.
	proxyURL := "http://" + proxyAddr
	var args map[string]string
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, args = kernelArgs(t, mustScript(t, f, macA))
		if args[protocol.CmdlineProxy] == proxyURL || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if args[protocol.CmdlineProxy] != proxyURL {
		t.Errorf("bcd.proxy = %q, want %q", args[protocol.CmdlineProxy], proxyURL)
	}
	tr := &http.Transport{Proxy: func(*http.Request) (*url.URL, error) { return url.Parse(proxyURL) }, DisableKeepAlives: true}
	tr.TLSClientConfig = &tls.Config{RootCAs: f.g.RootPool(), ServerName: "127.0.0.1"}
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	for _, tc := range []struct {
		url  string
		want int
	}{
		{"http://" + images + "/img", 200},
		{"http://" + other + "/img", 403},
		{"http://" + f.httpAddr + "/ramdisk/vmlinuz", 200}, // the boot server's own host:port
		{f.g.URL + protocol.PathSession, 401},              // the gateway, through CONNECT: its refusal of a session without a certificate
	} {
		resp, err := c.Get(tc.url)
		if err != nil {
			t.Errorf("GET %s via the proxy: %v", tc.url, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s via the proxy: %d, want %d", tc.url, resp.StatusCode, tc.want)
		}
	}

	// A ramdisk's own session, through the proxy as bcd.proxy tells it.
	rdDir := filepath.Join(t.TempDir(), "ramdisk")
	rdID := f.g.Identity(t, rdDir, protocol.RoleRamdisk, "ramdisk_1")
	j, err := journal.Open(filepath.Join(rdDir, "journal.db"), rdID.NodeID, journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	proxy, err := agent.ParseProxyURL(args[protocol.CmdlineProxy])
	if err != nil {
		t.Fatal(err)
	}
	sessions := f.g.Sessions()
	rctx, stopRamdisk := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() {
		rdone <- (&agent.Session{GatewayURL: f.g.URL, ServerName: "127.0.0.1", ServingCAPin: f.g.Pins.ServingCA,
			Identity: rdID, Journal: j, Proxy: proxy, Backoff: agent.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}}).Run(rctx)
	}()
	waitFor(t, "the ramdisk's session through the proxy", func() bool {
		for _, h := range f.g.Hellos() {
			if h.Role == protocol.RoleRamdisk {
				return true
			}
		}
		return false
	})
	if f.g.Sessions() <= sessions {
		t.Error("no new session")
	}
	stopRamdisk()
	<-rdone

	f.rec.send(t, protocol.FrameSpec, bootSpec(t, 2))
	waitFor(t, "the proxy to stop", func() bool { return !s.Addrs().Proxy.IsValid() })
	if conn, err := net.DialTimeout("tcp", proxyAddr, time.Second); err == nil {
		conn.Close()
		t.Error("the proxy still accepts connections")
	}
	if _, args := kernelArgs(t, mustScript(t, f, macA)); args[protocol.CmdlineProxy] != "" {
		t.Errorf("bcd.proxy = %q after the section went away", args[protocol.CmdlineProxy])
	}
}

func mustScript(t *testing.T, f *fixture, mac string) string {
	t.Helper()
	code, body := f.get(t, "/ipxe/"+mac+".ipxe")
	if code != 200 {
		t.Fatalf("script for %s: %d %s", mac, code, body)
	}
	return body
}

func newOrigin(t *testing.T, body string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// statusOf asks the status socket.
func statusOf(t *testing.T, path string) site.Status {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
	resp, err := c.Get("http://bcd" + site.StatusPath)
	if err != nil {
		t.Fatalf("status socket: %v", err)
	}
	defer resp.Body.Close()
	var st site.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("status socket mode: %v %v", fi.Mode(), err)
	}
	return st
}
