package site

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/ipxe"
	"github.com/better-compute/bcd/protocol"
)

// bootServers are the proxyDHCP, TFTP and HTTP boot servers of [boot], listening
// from openBoot until the context given to serve ends.
type bootServers struct {
	log     *slog.Logger
	events  *reporter
	witness *witness
	// base is the boot HTTP server as configured now; each request runs a copy
	// (see ServeHTTP), so the proxy parameter can change between requests.
	base   atomic.Pointer[boot.HTTPServer]
	params ipxe.Params // without bcd.proxy
	// hs serves base's deadlines and counts its connections; made with the
	// first base, so that every copy shares its Stats.
	hs     *http.Server
	httpLn net.Listener
	tftp   *boot.TFTPServer
	dhcp   *boot.ProxyDHCP
}

// ramdiskParams are the bcd.* parameters every ramdisk of this site gets.
func (s *Site) ramdiskParams() (ipxe.Params, error) {
	c := s.Config
	serverName, err := agent.ServerName(c.GatewayURL, c.GatewayServerName)
	if err != nil {
		return ipxe.Params{}, err
	}
	p := ipxe.Params{
		Witness:           strings.TrimSuffix(c.Boot.URL, "/") + protocol.WitnessPath,
		GatewayURL:        c.GatewayURL,
		ServerName:        serverName,
		Site:              s.siteName(),
		ServingCAPin:      c.ServingCASPKIPin,
		JoinSigningPin:    c.JoinSigningKeyPin,
		JoinEncryptionPin: c.JoinEncryptionKeyPin,
	}
	return p, p.Validate()
}

// httpListenAddr is [boot] listen, else every address on the port of [boot] url.
func httpListenAddr(listen, base string) (string, error) {
	if listen != "" {
		return listen, nil
	}
	hp, err := hostPortOf(base)
	if err != nil {
		return "", fmt.Errorf("[boot] url: %w", err)
	}
	_, port, _ := net.SplitHostPort(hp)
	return ":" + port, nil
}

// interfaceWith finds the interface that holds ip.
func interfaceWith(ip netip.Addr) (string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", err
	}
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if got, ok := netip.AddrFromSlice(n.IP); ok && got.Unmap() == ip {
					return ifi.Name, nil
				}
			}
		}
	}
	return "", fmt.Errorf("no interface has the address %s ([boot] server_ip); set [boot] interface or add the address", ip)
}

// openBoot opens every listener [boot] asks for, on the calling goroutine (so a
// caller that entered a network namespace gets them there), or none.
func (s *Site) openBoot() (_ *bootServers, err error) {
	b := s.Config.Boot
	params, err := s.ramdiskParams()
	if err != nil {
		return nil, invalid("[boot]: the ramdisk command line cannot be built from config.toml: %v", err)
	}
	bs := &bootServers{log: s.log, events: s.events, params: params,
		witness: newWitness(s.log, s.events, b.TrustAnyNeighbor, s.now, func() (string, crypto.Signer) {
			id := s.renewer.Current()
			return id.NodeID, id.Key()
		})}
	if bs.witness.nonceKey, err = loadWitnessKey(s.dataDir); err != nil {
		return nil, err
	}
	kernel, initrd := b.Kernel, b.Initrd
	base := strings.TrimSuffix(b.URL, "/")
	if kernel == "" && b.RamdiskDir != "" {
		kernel = base + "/ramdisk/vmlinuz"
	}
	if initrd == "" && b.RamdiskDir != "" {
		initrd = base + "/ramdisk/initrd"
	}
	httpSrv := &boot.HTTPServer{
		URL:        b.URL,
		Table:      &s.table,
		Params:     params,
		Kernel:     kernel,
		Initrd:     initrd,
		Cmdline:    b.Cmdline,
		RamdiskDir: b.RamdiskDir,
		BinDir:     b.TFTPRoot,
		Observer:   s.events,
		Logger:     s.log,
	}
	bs.hs = httpSrv.NewServer(bs)
	bs.base.Store(httpSrv)

	// On failure, close what was opened: Serve on an ended context does.
	defer func() {
		if err == nil {
			return
		}
		done, cancel := context.WithCancel(context.Background())
		cancel()
		if bs.httpLn != nil {
			bs.httpLn.Close()
		}
		if bs.tftp != nil {
			_ = bs.tftp.Serve(done)
		}
	}()

	addr, err := httpListenAddr(b.Listen, b.URL)
	if err != nil {
		return nil, err
	}
	if bs.httpLn, err = net.Listen("tcp", addr); err != nil {
		return nil, fmt.Errorf("boot HTTP: listening on %s: %w", addr, err)
	}
	s.setAddrs(func(a *Addrs) { a.HTTP = bs.httpLn.Addr().(*net.TCPAddr).AddrPort() })

	if b.TFTP != "" {
		bs.tftp = &boot.TFTPServer{Addr: b.TFTP, Root: b.TFTPRoot, Observer: s.events, Logger: s.log,
			MaxTransfers: int(b.TFTPMaxTransfers), TransferTimeout: time.Duration(b.TFTPTransferTimeout) * time.Second,
			ThreadNice: packetThreadNice}
		if err := bs.tftp.Listen(); err != nil {
			bs.tftp = nil
			return nil, err
		}
		s.setAddrs(func(a *Addrs) { a.TFTP = bs.tftp.LocalAddr() })
	}

	if b.ProxyDHCP {
		serverIP, err := netip.ParseAddr(b.ServerIP)
		if err != nil {
			return nil, invalid("[boot] server_ip %q is not an IPv4 address", b.ServerIP)
		}
		iface := b.Interface
		if iface == "" && !s.DHCPBroadcast.IsValid() {
			if iface, err = interfaceWith(serverIP); err != nil {
				return nil, fmt.Errorf("proxyDHCP: %w", err)
			}
		}
		bs.dhcp = &boot.ProxyDHCP{
			Interface:     iface,
			ServerIP:      serverIP,
			URL:           b.URL,
			Table:         &s.table,
			Observer:      s.events,
			Logger:        s.log,
			Addr:          s.DHCPAddr,
			PXEAddr:       s.PXEAddr,
			BroadcastAddr: s.DHCPBroadcast,
			ThreadNice:    dhcpThreadNice,
		}
		if err := bs.dhcp.Listen(); err != nil {
			bs.dhcp = nil
			return nil, err
		}
		dhcp, pxe := bs.dhcp.Addrs()
		s.setAddrs(func(a *Addrs) { a.DHCP, a.PXE = dhcp, pxe })
		s.log.Info("proxyDHCP listening", "interface", iface, "server_ip", serverIP, "dhcp", dhcp, "pxe", pxe)
	}
	s.log.Info("boot server listening", "http", bs.httpLn.Addr().String(), "url", b.URL, "tftp", b.TFTP, "proxy_dhcp", b.ProxyDHCP)
	return bs, nil
}

// packetThreadNice is the nice value of the threads that run TFTP transfers: in
// a storm a block should not wait for a time slice behind the site agent's
// events, its session or a serve on the same machine.
const packetThreadNice = -10

// dhcpThreadNice is 0: proxyDHCP's readers stay ordinary goroutines. Measured on
// the shipped binary beside dnsmasq (bench/results/boot-2026-12-02.txt, quiet
// A/B/A/B of -10 against 0): at -10 the 4011 REQUEST→ACK rate was 0.92–1.40×
// dnsmasq's and at 0 1.34–2.10×, with lower p99; DISCOVER's p99 did not change.
// An answer is a few microseconds of work: a reader pinned to its own raised
// thread costs more in handoffs to the goroutines it wakes than it gains.
const dhcpThreadNice = 0

// setProxy puts bcd.proxy=proxyURL on every ramdisk script from now on ("" for
// none).
func (bs *bootServers) setProxy(proxyURL string) {
	cur := bs.base.Load()
	if cur.Params.Proxy == proxyURL {
		return
	}
	next := *cur
	next.Params = bs.params
	next.Params.Proxy = proxyURL
	if err := next.Params.Validate(); err != nil {
		bs.log.Error("leaving bcd.proxy off the ramdisk command line", "proxy", proxyURL, "error", err.Error())
		next.Params.Proxy = ""
	}
	bs.base.Store(&next)
}

// serve runs every opened server until ctx ends; a server that fails sends its
// error to errc.
func (bs *bootServers) serve(ctx context.Context, wg *sync.WaitGroup, errc chan<- error) {
	fail := func(err error) {
		if err != nil && ctx.Err() == nil {
			select {
			case errc <- err:
			default:
			}
		}
	}
	hs := bs.hs
	wg.Go(func() {
		if err := hs.Serve(bs.httpLn); !errors.Is(err, http.ErrServerClosed) {
			fail(fmt.Errorf("boot HTTP: %w", err))
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			hs.Close()
		}
	})
	if bs.tftp != nil {
		wg.Go(func() { fail(bs.tftp.Serve(ctx)) })
	}
	if bs.dhcp != nil {
		wg.Go(func() { fail(bs.dhcp.Serve(ctx)) })
	}
}

// ServeHTTP serves a boot request with a copy of the configured boot.HTTPServer
// whose nonce minter belongs to this request, so that a nonce that could not be
// journaled turns the answer into 503 (the boot server's own answer would be 500:
// the machine should retry, not an operator fix a script).
func (bs *bootServers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == protocol.WitnessPath {
		bs.witness.ServeHTTP(w, r)
		return
	}
	srv := *bs.base.Load()
	if !strings.HasPrefix(r.URL.Path, "/ipxe/") || !strings.HasSuffix(r.URL.Path, ".ipxe") {
		srv.ServeHTTP(w, r) // kernel and initrd keep the connection's sendfile path
		return
	}
	uw := &unavailableWriter{ResponseWriter: w}
	srv.Nonces = boot.NonceMinterFunc(func(mac net.HardwareAddr) (string, error) {
		n, err := bs.witness.mint(r, mac)
		var refused *boot.RefusedError
		if err != nil && !errors.As(err, &refused) {
			uw.failed = true
		}
		return n, err
	})
	srv.ServeHTTP(uw, r)
}

// unavailableWriter turns the 500 of a script whose nonce could not be journaled
// into 503 with Retry-After.
type unavailableWriter struct {
	http.ResponseWriter
	failed, replaced bool
}

func (w *unavailableWriter) WriteHeader(code int) {
	if code == http.StatusInternalServerError && w.failed {
		w.replaced = true
		h := w.Header()
		h.Set("Retry-After", "10")
		h.Set("Content-Type", "text/plain; charset=utf-8")
		w.ResponseWriter.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.ResponseWriter.Write([]byte("the site agent cannot record a boot nonce for this machine right now; retry\n"))
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets the boot server's write deadlines reach the connection.
func (w *unavailableWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *unavailableWriter) Write(b []byte) (int, error) {
	if w.replaced {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// proxyURL is the bcd.proxy a machine dials for listen: its host, or server_ip
// when it listens on every address.
func proxyURL(listen, serverIP string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return ""
	}
	if a, err := netip.ParseAddr(host); host == "" || (err == nil && a.IsUnspecified()) {
		if serverIP == "" {
			return ""
		}
		host = serverIP
	}
	return (&url.URL{Scheme: "http", Host: net.JoinHostPort(host, port)}).String()
}
