package site

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/site/httpproxy"
)

// proxyRunner starts, reconfigures and stops the site's HTTP proxy as the
// http_proxy section comes and goes.
type proxyRunner struct {
	site *Site

	mu      sync.Mutex
	closed  bool
	listen  string
	srv     *httpproxy.Server
	cancel  context.CancelFunc
	done    chan struct{}
	running sync.WaitGroup
	urlNow  string
}

// alwaysAllowed are the destinations every machine needs: the gateway, and the
// boot server for images an operator keeps beside the ramdisk.
func (p *proxyRunner) alwaysAllowed() []string {
	c := p.site.Config
	var out []string
	if hp, err := hostPortOf(c.GatewayURL); err == nil {
		out = append(out, hp)
	}
	if c.Boot != nil {
		if hp, err := hostPortOf(c.Boot.URL); err == nil {
			out = append(out, hp)
		}
	}
	return out
}

// apply makes sec the running proxy: nil stops it, a new listen address restarts
// it, a new allowed list is swapped in without dropping open tunnels.
func (p *proxyRunner) apply(sec *protocol.HTTPProxySection) {
	log := p.site.log
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if sec == nil || (p.srv != nil && sec.Listen != p.listen) {
		if p.srv != nil {
			log.Info("stopping the HTTP proxy", "listen", p.listen)
			p.cancel()
			<-p.done
			p.srv, p.listen, p.urlNow = nil, "", ""
			p.site.setAddrs(func(a *Addrs) { a.Proxy = netip.AddrPort{} })
		}
		if sec == nil {
			return
		}
	}
	allowed := append(slices.Clone(sec.Allow), p.alwaysAllowed()...)
	if p.srv != nil {
		if err := p.srv.SetAllowed(allowed); err != nil {
			log.Error("keeping the HTTP proxy's allowed list", "error", err.Error())
		}
		return
	}
	srv := &httpproxy.Server{Logger: log}
	if err := srv.SetAllowed(allowed); err != nil {
		log.Error("not starting the HTTP proxy", "error", err.Error())
		return
	}
	ln, err := net.Listen("tcp", sec.Listen)
	if err != nil {
		// The next spec (every reconnect brings one) tries again.
		log.Error("cannot start the HTTP proxy", "listen", sec.Listen, "error", err.Error())
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	p.srv, p.listen, p.cancel, p.done = srv, sec.Listen, cancel, done
	serverIP := ""
	if b := p.site.Config.Boot; b != nil {
		serverIP = b.ServerIP
	}
	p.urlNow = proxyURL(sec.Listen, serverIP)
	if p.urlNow == "" {
		log.Warn("the HTTP proxy listens on every address and [boot] has no server_ip: machines are not told to use it", "listen", sec.Listen)
	}
	p.site.setAddrs(func(a *Addrs) { a.Proxy = ln.Addr().(*net.TCPAddr).AddrPort() })
	log.Info("HTTP proxy listening", "listen", ln.Addr().String(), "allowed", allowed)
	p.running.Go(func() {
		err := srv.Serve(ctx, ln)
		close(done)
		if err == nil || ctx.Err() != nil {
			return
		}
		log.Error("the HTTP proxy stopped; the next spec starts it again", "error", err.Error())
		p.mu.Lock()
		if p.done == done {
			p.srv, p.listen, p.urlNow = nil, "", ""
			p.site.setAddrs(func(a *Addrs) { a.Proxy = netip.AddrPort{} })
		}
		p.mu.Unlock()
	})
}

// url is the proxy's URL for bcd.proxy, or "" when none runs.
func (p *proxyRunner) url() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.urlNow
}

// wait stops the proxy when ctx ends and keeps any from starting afterwards.
func (p *proxyRunner) wait(ctx context.Context) {
	<-ctx.Done()
	p.mu.Lock()
	p.closed = true
	if p.cancel != nil {
		p.cancel()
	}
	p.mu.Unlock()
	p.running.Wait()
}
