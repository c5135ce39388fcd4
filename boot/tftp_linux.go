package boot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// currentNetns opens the network namespace of the calling thread.
func currentNetns() (*os.File, error) {
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("TFTP: finding the network namespace: %w", err)
	}
	return f, nil
}

// serveInNetns runs serve on a thread inside ns. The server opens a socket for each
// transfer on the thread that reads the requests, so that thread must be in the
// namespace Listen ran in: a caller that entered a namespace only to Listen (as
// the testbed does) would otherwise open transfer sockets in its own.
func serveInNetns(ns *os.File, serve func() error) error {
	runtime.LockOSThread()
	here, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("TFTP: finding the network namespace: %w", err)
	}
	want, err := ns.Stat()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("TFTP: network namespace: %w", err)
	}
	a, b := here.Sys().(*syscall.Stat_t), want.Sys().(*syscall.Stat_t)
	if a.Dev == b.Dev && a.Ino == b.Ino {
		runtime.UnlockOSThread()
		return serve()
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("TFTP: entering the network namespace Listen ran in: %w", err)
	}
	// The thread stays locked: it belongs to ns now and ends with this goroutine.
	return serve()
}

// tftpEnablePktinfo asks the kernel to say, with each request, which address and
// interface it came in on: the transfer answers from that address, with blocks the
// interface's MTU carries.
func tftpEnablePktinfo(conn *net.UDPConn) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		// Both: a dual-stack socket reports IPv4 datagrams with IP_PKTINFO.
		e4 := unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		e6 := unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
		if e4 != nil && e6 != nil {
			serr = e4
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// tftpParsePktinfo reads the local address and interface index of a request from
// its control messages; a broadcast destination gives no address (the transfer
// then answers from the one the kernel picks).
func tftpParsePktinfo(oob []byte) (local netip.Addr, ifindex int) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return netip.Addr{}, 0
	}
	for _, m := range msgs {
		switch {
		case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			ifindex = int(int32(nativeUint32(m.Data[0:4])))
			// Addr is the header's destination; Spec_dst the local address the
			// route would answer from. Answer from the one the client wrote to,
			// unless that was a broadcast.
			a := netip.AddrFrom4([4]byte(m.Data[8:12]))
			if a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
				a = netip.AddrFrom4([4]byte(m.Data[4:8]))
			}
			local = a
		case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			local = netip.AddrFrom16([16]byte(m.Data[0:16]))
			ifindex = int(nativeUint32(m.Data[16:20]))
		}
	}
	if local.IsUnspecified() {
		local = netip.Addr{}
	}
	return local, ifindex
}

// rawRead and rawWrite are read and write on the transfers' sockets, which
// never block: raw system calls, without the runtime's bookkeeping for a call
// that might (entersyscall, exitsyscall), which a storm of small blocks pays
// twice a block.
func rawRead(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawWrite(fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// nativeUint32 reads a field the kernel wrote in the host's byte order.
func nativeUint32(b []byte) uint32 { return binary.NativeEndian.Uint32(b) }

// defaultTFTPMaxTransfers is DefaultTFTPMaxTransfers, or half the descriptors
// the process may open when that is fewer: a transfer holds one, and the rest of
// the site agent needs its own.
func defaultTFTPMaxTransfers() int {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil || r.Cur == unix.RLIM_INFINITY {
		return DefaultTFTPMaxTransfers
	}
	return int(max(min(uint64(DefaultTFTPMaxTransfers), r.Cur/2), 16))
}

// tftpSock is a transfer's socket: a raw non-blocking descriptor, connected to the
// client, so that the kernel drops datagrams from anyone else and a client that
// went away shows as ECONNREFUSED.
type tftpSock struct{ fd int }

// open makes the socket, bound to local (or any address) and connected to remote.
func (t *tftpSock) open(local netip.Addr, remote netip.AddrPort) error {
	t.fd = -1
	family := unix.AF_INET
	var laddr, raddr unix.Sockaddr
	if ra := remote.Addr(); ra.Is4() || ra.Is4In6() {
		raddr = &unix.SockaddrInet4{Port: int(remote.Port()), Addr: ra.Unmap().As4()}
		la := &unix.SockaddrInet4{}
		if local.Is4() || local.Is4In6() {
			la.Addr = local.Unmap().As4()
		}
		laddr = la
	} else {
		family = unix.AF_INET6
		r6 := &unix.SockaddrInet6{Port: int(remote.Port()), Addr: ra.As16()}
		if z := ra.Zone(); z != "" {
			if ifi, err := net.InterfaceByName(z); err == nil {
				r6.ZoneId = uint32(ifi.Index)
			}
		}
		raddr = r6
		la := &unix.SockaddrInet6{ZoneId: r6.ZoneId}
		if local.Is6() && !local.Is4In6() {
			la.Addr = local.As16()
		}
		laddr = la
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := unix.Bind(fd, laddr); err != nil {
		unix.Close(fd)
		return err
	}
	if err := unix.Connect(fd, raddr); err != nil {
		unix.Close(fd)
		return err
	}
	t.fd = fd
	return nil
}

func (t *tftpSock) write(b []byte) error {
	for {
		_, err := rawWrite(t.fd, b)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN, unix.ENOBUFS:
			// The socket's send buffer is full: the datagram is as good as lost,
			// and the timeout sends it again.
			return nil
		}
		return err
	}
}

func (t *tftpSock) close() {
	if t.fd >= 0 {
		unix.Close(t.fd)
		t.fd = -1
	}
}

// tftpPoller runs every transfer from one goroutine: an epoll set of their sockets,
// and a clock for the retransmissions.
type tftpPoller struct {
	s     *TFTPServer
	epfd  int
	evfd  int // wakes the poller for new transfers and for closing
	start time.Time

	mu      sync.Mutex
	pending []*tftpTransfer
	closing bool

	// The poller goroutine's own, unlocked.
	byFD map[int32]*tftpTransfer
	// next is the earliest deadline of a transfer, or later: the transfers are
	// checked when it passes.
	next time.Duration
	// pkt and scratch are the send and read buffers of every transfer: one
	// goroutine runs them all, so a transfer needs none of its own.
	pkt, scratch []byte
}

// tftpExpireEvery is the least time between two scans of the transfers for
// deadlines: a flood of requests that are never acknowledged has deadlines
// microseconds apart, and one scan each would cost the transfers squared.
const tftpExpireEvery = 5 * time.Millisecond

func newTFTPPoller(s *TFTPServer) (*tftpPoller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(evfd)}); err != nil {
		unix.Close(epfd)
		unix.Close(evfd)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	return &tftpPoller{s: s, epfd: epfd, evfd: evfd, start: time.Now(), byFD: map[int32]*tftpTransfer{}, next: 1<<63 - 1,
		pkt: make([]byte, 4+tftpMaxBlksize), scratch: make([]byte, tftpMaxBlksize)}, nil
}

// now is the poller's clock: monotonic, and cheaper to compare than time.Time.
func (p *tftpPoller) now() time.Duration { return time.Since(p.start) }

// add hands a transfer to the poller, which sends its first packet.
func (p *tftpPoller) add(t *tftpTransfer) {
	p.mu.Lock()
	if p.closing {
		p.mu.Unlock()
		t.close()
		p.s.finished(t, errors.New("server shutting down"))
		return
	}
	p.pending = append(p.pending, t)
	p.mu.Unlock()
	p.wake()
}

// close lets the poller end once the transfers running are done.
func (p *tftpPoller) close() {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	p.wake()
}

func (p *tftpPoller) wake() {
	var one = [8]byte{1}
	for {
		if _, err := unix.Write(p.evfd, one[:]); err != unix.EINTR {
			return
		}
	}
}

func (p *tftpPoller) run() {
	if p.s.ThreadNice != 0 {
		restore, err := pinAndRaise(p.s.ThreadNice)
		defer restore()
		if err != nil && !p.s.niceWarned.Swap(true) {
			p.s.log.Warn("TFTP: transfers run at the process's priority", "err", err)
		}
	}
	defer unix.Close(p.epfd)
	defer unix.Close(p.evfd)
	events := make([]unix.EpollEvent, 128)
	buf := make([]byte, 1500)
	var drain [8]byte
	for {
		wait := -1
		if len(p.byFD) > 0 {
			d := p.next - p.now()
			wait = int(max(0, (d+time.Millisecond-1)/time.Millisecond))
		}
		n, err := unix.EpollWait(p.epfd, events, wait)
		if err != nil && err != unix.EINTR {
			p.s.log.Warn("TFTP: epoll_wait", "err", err)
			// Do not spin on a persistent error; the transfers time out meanwhile.
			time.Sleep(10 * time.Millisecond)
		}
		now := p.now()
		for i := range max(n, 0) {
			fd := events[i].Fd
			if int(fd) == p.evfd {
				unix.Read(p.evfd, drain[:])
				if p.admit(now) {
					return
				}
				continue
			}
			t := p.byFD[fd]
			if t == nil {
				continue
			}
			// One datagram per event: epoll is level-triggered, and a second
			// read would nearly always be an EAGAIN, a syscall for nothing.
			m, err := rawRead(int(fd), buf)
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err != nil {
				p.end(t, fmt.Errorf("the client went away: %w", err))
				continue
			}
			done, err := t.receive(buf[:m], now)
			if done || err != nil {
				p.end(t, err)
				continue
			}
			p.next = min(p.next, t.deadline)
		}
		if now >= p.next {
			p.expire(now)
		}
	}
}

// admit starts the transfers handed over since the last time; it says whether the
// poller is closing with nothing left to do.
func (p *tftpPoller) admit(now time.Duration) bool {
	p.mu.Lock()
	pending, closing := p.pending, p.closing
	p.pending = nil
	p.mu.Unlock()
	for _, t := range pending {
		if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, t.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(t.fd)}); err != nil {
			t.close()
			p.s.finished(t, fmt.Errorf("epoll: %w", err))
			continue
		}
		p.byFD[int32(t.fd)] = t
		t.pkt, t.scratch = p.pkt, p.scratch
		if err := t.begin(now); err != nil {
			p.end(t, err)
			continue
		}
		p.next = min(p.next, t.deadline)
	}
	return closing && len(p.byFD) == 0
}

// expire sends again for every transfer past its deadline, and finds the next one.
func (p *tftpPoller) expire(now time.Duration) {
	p.next = 1<<63 - 1
	for _, t := range p.byFD {
		if now >= t.deadline {
			if err := t.expire(now); err != nil {
				p.end(t, err)
				continue
			}
		}
		p.next = min(p.next, t.deadline)
	}
	p.next = max(p.next, now+tftpExpireEvery)
}

// end closes a transfer's socket (which takes it out of the epoll set) and reports it.
func (p *tftpPoller) end(t *tftpTransfer, err error) {
	delete(p.byFD, int32(t.fd))
	t.close()
	p.s.finished(t, err)
	if len(p.byFD) == 0 {
		p.mu.Lock()
		closing := p.closing && len(p.pending) == 0
		p.mu.Unlock()
		if closing {
			// Let the loop see it: the eventfd may have been drained already.
			p.wake()
		}
	}
}

// tftpPollers is how many pollers a server runs: one per core the runtime
// uses but one, at least one and up to 4 (beyond, the one goroutine reading
// requests is the limit). A poller waits in epoll_wait holding its P (the
// runtime's right to run Go code); when every P is held so, the runtime's
// monitor takes them back after 20 µs, and each wake-up of a poller then goes
// through the scheduler's slow path, to a P free on another thread, while the
// goroutine reading requests and the rest of the process wait for one. One P
// left over keeps the pollers' returns on the fast path: on 2 cores one
// poller served a 16-client storm at blksize 512 at 9.3 ms of CPU per MiB
// where two spent 13.1, and 1.16× dnsmasq's rate where two reached 0.92×.
func tftpPollers() int { return max(1, min(runtime.GOMAXPROCS(0)-1, 4)) }
