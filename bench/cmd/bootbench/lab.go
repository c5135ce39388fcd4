package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/testbed"
)

// Servers by name, as the tables show them.
const (
	// serverSite is the headline: the bcd binary running `bcd site`, joined to a
	// real serve. serverLib is bcd's boot library in this process, as the first
	// version of this benchmark measured it.
	serverSite    = "bcd-site"
	serverLib     = "bcd-lib"
	serverServe   = "serve" // not measured against: its CPU time is bcd-site's cost too
	serverDnsmasq = "dnsmasq"
	serverTFTPHPA = "tftp-hpa"
	serverNginx   = "nginx"
)

// Files served, and the benchmark's boot table.
const (
	tftpFile   = "undionly.kpxe" // 1 MiB: an iPXE-sized binary
	tftpSize   = 1 << 20
	initrdSize = 30 << 20
	kernelSize = 8 << 20 // when no Debian kernel is cached
	tableMACs  = 4096    // the library's boot table; the shipped site's is -machines
	httpPort   = 8080
	// tftpMax is dnsmasq's tftp-max and the library's MaxTransfers: above the
	// most clients measured (256), so that neither turns one away. bcd site
	// runs with what it ships.
	tftpMax = 300
)

// target is one server's end of the lab: its namespace, its address on the veth
// to the client namespace, and the client's interface and address on that veth.
type target struct {
	name        string
	ns          *testbed.Netns
	serverIP    netip.Addr
	clientIface string
	clientIP    netip.Addr
}

// lab is the namespaces, files and servers of one benchmark run.
type lab struct {
	id      string
	dir     string // files served, configurations, logs
	client  *testbed.Netns
	targets map[string]*target
	procs   []*testbed.Process
	pids    map[string]int     // each peer's process, by server name
	cgroups map[string]*cgroup // each peer's cgroup, by server name
	log     io.Writer
	nss     []*testbed.Netns
	stop    context.CancelFunc // bcd's servers
	served  chan error         // one value per bcd server when it has stopped
	nServed int
	bcd     bcdServers
	// kernel describes where the HTTP kernel came from, for the report.
	kernel string
}

// bcdServers are bcd's three servers, as the site agent runs them.
type bcdServers struct {
	dhcp *boot.ProxyDHCP
	tftp *boot.TFTPServer
	http *boot.HTTPServer
}

// peerPaths are the peers' executables; an empty path leaves that peer out.
type peerPaths struct {
	dnsmasq, inTFTPD, nginx string
}

// newLab makes the files, the namespaces and the veths, and starts every server:
// bcd's in this process, the peers as processes.
func newLab(ctx context.Context, dir, kernel string, peers peerPaths, shipped shippedBinaries, library bool, exe string, log io.Writer) (_ *lab, err error) {
	l := &lab{id: strconv.Itoa(os.Getpid()), dir: dir, targets: map[string]*target{}, pids: map[string]int{}, cgroups: map[string]*cgroup{}, log: log, served: make(chan error, 3)}
	defer func() {
		if err != nil {
			l.close(log)
		}
	}()
	if err := l.makeFiles(kernel); err != nil {
		return nil, err
	}
	if l.client, err = l.netns("c"); err != nil {
		return nil, err
	}
	var names []string
	if shipped.bcd != "" {
		names = append(names, serverSite)
	}
	if library {
		names = append(names, serverLib)
	}
	for _, p := range []struct{ name, path string }{
		{serverDnsmasq, peers.dnsmasq}, {serverTFTPHPA, peers.inTFTPD}, {serverNginx, peers.nginx},
	} {
		if p.path != "" {
			names = append(names, p.name)
		}
	}
	for i, name := range names {
		ns, err := l.netns(strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		t := &target{
			name:        name,
			ns:          ns,
			serverIP:    netip.AddrFrom4([4]byte{10, 77, byte(i + 1), 1}),
			clientIface: "c-" + strings.ReplaceAll(name, "-", ""),
			clientIP:    netip.AddrFrom4([4]byte{10, 77, byte(i + 1), 2}),
		}
		if err := testbed.Veth(ns, "srv0", t.serverIP.String()+"/24", l.client, t.clientIface, t.clientIP.String()+"/24"); err != nil {
			return nil, err
		}
		l.targets[name] = t
	}
	if library {
		if err := l.startBCD(); err != nil {
			return nil, err
		}
	}
	if peers.dnsmasq != "" {
		if err := l.startDnsmasq(ctx, peers.dnsmasq); err != nil {
			return nil, err
		}
	}
	if peers.inTFTPD != "" {
		if err := l.startTFTPHPA(ctx, peers.inTFTPD); err != nil {
			return nil, err
		}
	}
	if peers.nginx != "" {
		if err := l.startNginx(ctx, peers.nginx); err != nil {
			return nil, err
		}
	}
	if shipped.bcd != "" {
		if err := l.startShipped(ctx, shipped, exe); err != nil {
			return nil, err
		}
	}
	// Start measuring from a settled heap: setting up (the boot table, the
	// files) leaves garbage whose collection would count as bcd's CPU time.
	debug.FreeOSMemory()
	return l, nil
}

func (l *lab) netns(suffix string) (*testbed.Netns, error) {
	ns, err := testbed.NewNetns("bootbench" + l.id + suffix)
	if err != nil {
		return nil, err
	}
	l.nss = append(l.nss, ns)
	return ns, nil
}

// makeFiles writes the TFTP file, the kernel and the initrd. Every directory is
// world-readable: tftp-hpa and nginx's workers read as nobody.
func (l *lab) makeFiles(kernel string) error {
	if err := os.Chmod(l.dir, 0o755); err != nil {
		return err
	}
	for _, d := range []string{"tftp", "ramdisk", "nginx", "dnsmasq", "logs"} {
		if err := os.MkdirAll(filepath.Join(l.dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := randomFile(filepath.Join(l.dir, "tftp", tftpFile), tftpSize); err != nil {
		return err
	}
	if err := randomFile(filepath.Join(l.dir, "ramdisk", "initrd"), initrdSize); err != nil {
		return err
	}
	vmlinuz := filepath.Join(l.dir, "ramdisk", "vmlinuz")
	if kernel != "" {
		if err := copyFile(kernel, vmlinuz); err != nil {
			return err
		}
		fi, err := os.Stat(vmlinuz)
		if err != nil {
			return err
		}
		l.kernel = fmt.Sprintf("%s (%.1f MiB)", kernel, float64(fi.Size())/(1<<20))
		return nil
	}
	l.kernel = fmt.Sprintf("random (%d MiB; no Debian kernel in .cache/kernel/current)", kernelSize>>20)
	return randomFile(vmlinuz, kernelSize)
}

// randomFile writes size random bytes to path a MiB at a time: bcd's servers
// share this process, and a heap grown by tens of MiB would be collected and
// handed back to the kernel during the first measurements, on their CPU time.
func randomFile(path string, size int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.CopyBuffer(f, io.LimitReader(rand.Reader, int64(size)), make([]byte, 1<<20)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("kernel: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.CopyBuffer(out, in, make([]byte, 1<<20)); err != nil {
		out.Close()
		return fmt.Errorf("kernel: %w", err)
	}
	return out.Close()
}

// startBCD starts boot.ProxyDHCP, boot.TFTPServer and boot.HTTPServer with the
// settings a site agent uses, their sockets opened inside the bcd namespace.
func (l *lab) startBCD() error {
	t := l.targets[serverLib]
	entries := make(map[string]boot.Entry, tableMACs)
	for i := range tableMACs {
		m := benchMAC(i)
		entries[net.HardwareAddr(m[:]).String()] = boot.Entry{Mode: boot.ModeRamdisk}
	}
	table := &boot.MemTable{}
	if err := table.Set(entries); err != nil {
		return err
	}
	url := fmt.Sprintf("http://%s:%d", t.serverIP, httpPort)
	l.bcd = bcdServers{
		dhcp: &boot.ProxyDHCP{Interface: "srv0", ServerIP: t.serverIP, URL: url, Table: table},
		// MaxTransfers as dnsmasq's tftp-max below: neither turns a client away.
		// An IPv4 address rather than the spec's ":69": on a dual-stack socket
		// pin/tftp sizes blocks for IPv6 headers (MTU - 48), granting 1452 bytes
		// where IPv4 allows the 1468 asked for and the peers grant.
		tftp: &boot.TFTPServer{Addr: netip.AddrPortFrom(t.serverIP, 69).String(), Root: filepath.Join(l.dir, "tftp"), MaxTransfers: tftpMax},
		http: &boot.HTTPServer{URL: url, Table: table, RamdiskDir: filepath.Join(l.dir, "ramdisk"), Kernel: "vmlinuz", Initrd: "initrd"},
	}
	var ln net.Listener
	err := t.ns.Do(func() error {
		if err := l.bcd.dhcp.Listen(); err != nil {
			return err
		}
		if err := l.bcd.tftp.Listen(); err != nil {
			return err
		}
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(t.serverIP, httpPort).String())
		return err
	})
	if err != nil {
		return fmt.Errorf("bcd servers: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	l.nServed = 3
	go func() { l.served <- l.bcd.dhcp.Serve(ctx) }()
	go func() { l.served <- l.bcd.tftp.Serve(ctx) }()
	go func() { l.served <- l.bcd.http.Serve(ctx, ln) }()
	return nil
}

// startDnsmasq runs one dnsmasq as proxyDHCP and TFTP server, as a site that
// boots with dnsmasq would, with per-packet logging off (it costs dnsmasq a
// third of its rate).
func (l *lab) startDnsmasq(ctx context.Context, path string) error {
	t := l.targets[serverDnsmasq]
	d := filepath.Join(l.dir, "dnsmasq")
	subnet := netip.PrefixFrom(t.serverIP, 24).Masked().Addr()
	conf := strings.Join([]string{
		"port=0", // no DNS
		"interface=srv0",
		"bind-interfaces",
		"no-resolv",
		"no-hosts",
		"dhcp-range=" + subnet.String() + ",proxy",
		`pxe-service=x86PC,"PXE",undionly.kpxe`,
		// OVMF and other x86-64 UEFI clients (option 93 = 7) chain-load iPXE EFI.
		`pxe-service=X86-64_EFI,"PXE",ipxe.efi`,
		"dhcp-boot=undionly.kpxe",
		"dhcp-leasefile=" + filepath.Join(d, "leases"),
		"enable-tftp",
		"tftp-root=" + filepath.Join(l.dir, "tftp"),
		"tftp-max=" + strconv.Itoa(tftpMax),
		"quiet-dhcp",
		"quiet-tftp",
		"",
	}, "\n")
	cf := filepath.Join(d, "dnsmasq.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return err
	}
	cmd := t.ns.Command(path, "--keep-in-foreground", "--log-facility=-", "--conf-file="+cf,
		"--pid-file="+filepath.Join(d, "dnsmasq.pid"), "--user=root")
	return l.startPeer(ctx, serverDnsmasq, cmd, []portCheck{{"udp", 67}, {"udp", 4011}, {"udp", 69}})
}

// startTFTPHPA runs in.tftpd in the foreground, listening itself (-L), chrooted
// into the TFTP directory.
func (l *lab) startTFTPHPA(ctx context.Context, path string) error {
	t := l.targets[serverTFTPHPA]
	cmd := t.ns.Command(path, "-L", "-s", filepath.Join(l.dir, "tftp"), "-a", netip.AddrPortFrom(t.serverIP, 69).String())
	return l.startPeer(ctx, serverTFTPHPA, cmd, []portCheck{{"udp", 69}})
}

// startNginx runs nginx in the foreground with a configuration of its own:
// sendfile on, access log off, the ramdisk at the same paths bcd serves it.
func (l *lab) startNginx(ctx context.Context, path string) error {
	t := l.targets[serverNginx]
	d := filepath.Join(l.dir, "nginx")
	conf := fmt.Sprintf(`worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 4096; }
http {
    sendfile on;
    tcp_nopush on;
    access_log off;
    keepalive_requests 100000;
    default_type application/octet-stream;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    server {
        listen %[2]s;
        location /ramdisk/ { alias %[3]s/; }
    }
}
`, d, netip.AddrPortFrom(t.serverIP, httpPort), filepath.Join(l.dir, "ramdisk"))
	cf := filepath.Join(d, "nginx.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return err
	}
	cmd := t.ns.Command(path, "-c", cf, "-p", d, "-g", "daemon off;")
	return l.startPeer(ctx, serverNginx, cmd, []portCheck{{"tcp", httpPort}})
}

// startPeer starts a peer's command in a cgroup of its own (when the machine
// has cgroup v2) and waits until it listens on ports.
func (l *lab) startPeer(ctx context.Context, name string, cmd *exec.Cmd, ports []portCheck) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cg, err := newCgroup("bootbench" + l.id + "-" + name)
	if err != nil {
		fmt.Fprintf(l.log, "bootbench: %v; counting %s's CPU time from /proc instead\n", err, name)
	} else {
		l.cgroups[name] = cg
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(cg.fd.Fd())
	}
	p, err := testbed.StartProcess(name, cmd, filepath.Join(l.dir, "logs", name+".log"))
	if err != nil {
		return err
	}
	l.procs = append(l.procs, p)
	l.pids[name] = p.PID()
	return waitListening(ctx, p, ports)
}

// serverCPU is the CPU time the server has used so far: this process's for bcd's
// library, the cgroup's (or, without one, the process tree's) for bcd site,
// serve and the peers.
func (l *lab) serverCPU(name string) (time.Duration, error) {
	if name == serverLib {
		return selfCPU()
	}
	if cg := l.cgroups[name]; cg != nil {
		return cg.usage()
	}
	pid, ok := l.pids[name]
	if !ok {
		return 0, fmt.Errorf("no process for %s", name)
	}
	return treeCPU(pid)
}

type portCheck struct {
	proto string // "udp" or "tcp"
	port  int
}

// waitListening waits until p's network namespace has a socket on every port (a
// listening one for TCP), reading /proc/PID/net, which shows p's namespace.
func waitListening(ctx context.Context, p *testbed.Process, ports []portCheck) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		missing := ""
		for _, pc := range ports {
			ok, err := hasSocket(p.PID(), pc)
			if err != nil || !ok {
				missing = fmt.Sprintf("%s/%d", pc.proto, pc.port)
				break
			}
		}
		if missing == "" {
			return nil
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("%s exited at start (%v):\n%s", p.Name, p.Err(), p.Tail(20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not listening on %s after 10 s:\n%s", p.Name, missing, p.Tail(20))
		}
	}
}

func hasSocket(pid int, pc portCheck) (bool, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, pc.proto))
	if err != nil {
		return false, err
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X", pc.port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasSuffix(f[1], want) {
			continue
		}
		if pc.proto == "tcp" && f[3] != "0A" { // 0A: LISTEN
			continue
		}
		return true, nil
	}
	return false, sc.Err()
}

// close stops every server (bcd's, then each peer by its PID), deletes the
// namespaces and reports what failed to log.
func (l *lab) close(log io.Writer) {
	if l.stop != nil {
		l.stop()
		timeout := time.After(10 * time.Second)
	wait:
		for range l.nServed {
			select {
			case err := <-l.served:
				if err != nil {
					fmt.Fprintln(log, "bootbench: a bcd server:", err)
				}
			case <-timeout:
				fmt.Fprintln(log, "bootbench: bcd's servers did not stop within 10 s")
				break wait
			}
		}
	}
	for _, p := range l.procs {
		p.Stop(5 * time.Second)
	}
	var errs []error
	for _, cg := range l.cgroups {
		errs = append(errs, cg.remove())
	}
	for i := len(l.nss) - 1; i >= 0; i-- {
		errs = append(errs, l.nss[i].Close())
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(log, "bootbench:", err)
	}
}
