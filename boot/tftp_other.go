//go:build !linux

package boot

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"
)

func currentNetns() (*os.File, error) { return nil, nil }

func serveInNetns(_ *os.File, serve func() error) error { return serve() }

func tftpEnablePktinfo(*net.UDPConn) error { return nil }

func tftpParsePktinfo([]byte) (netip.Addr, int) { return netip.Addr{}, 0 }

func defaultTFTPMaxTransfers() int { return DefaultTFTPMaxTransfers }

// tftpSock is a transfer's socket, connected to the client.
type tftpSock struct{ conn *net.UDPConn }

func (t *tftpSock) open(local netip.Addr, remote netip.AddrPort) error {
	var laddr *net.UDPAddr
	if local.IsValid() {
		laddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(local, 0))
	}
	c, err := net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(remote))
	if err != nil {
		return err
	}
	t.conn = c
	return nil
}

func (t *tftpSock) write(b []byte) error {
	_, err := t.conn.Write(b)
	return err
}

func (t *tftpSock) close() {
	if t.conn != nil {
		t.conn.Close()
	}
}

// tftpPoller runs each transfer in a goroutine of its own where there is no epoll.
type tftpPoller struct {
	s     *TFTPServer
	start time.Time
	wg    sync.WaitGroup
	mu    sync.Mutex
	done  bool
	quit  chan struct{}
}

func newTFTPPoller(s *TFTPServer) (*tftpPoller, error) {
	return &tftpPoller{s: s, start: time.Now(), quit: make(chan struct{})}, nil
}

func (p *tftpPoller) now() time.Duration { return time.Since(p.start) }

func (p *tftpPoller) add(t *tftpTransfer) {
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		t.close()
		p.s.finished(t, errors.New("server shutting down"))
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		err := p.transfer(t)
		t.close()
		p.s.finished(t, err)
	}()
}

func (p *tftpPoller) transfer(t *tftpTransfer) error {
	if err := t.begin(p.now()); err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		t.conn.SetReadDeadline(p.start.Add(t.deadline))
		n, err := t.conn.Read(buf)
		now := p.now()
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return err
			}
			if err := t.expire(now); err != nil {
				return err
			}
			continue
		}
		done, err := t.receive(buf[:n], now)
		if done || err != nil {
			return err
		}
	}
}

func (p *tftpPoller) close() {
	p.mu.Lock()
	if !p.done {
		p.done = true
		close(p.quit)
	}
	p.mu.Unlock()
}

func (p *tftpPoller) run() {
	<-p.quit
	p.wg.Wait()
}
