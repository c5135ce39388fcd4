package boot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/better-compute/bcd/internal/lograte"
)

// MaxTFTPFile is the largest file the TFTP server sends. iPXE binaries are under 2 MB;
// a TFTP transfer at the default block size cannot exceed 32 MiB anyway.
const MaxTFTPFile = 32 << 20

// maxTFTPCache bounds the memory the TFTP server keeps file contents in.
const maxTFTPCache = 64 << 20

// TFTPStats counts what a TFTPServer did.
type TFTPStats struct {
	Transfers uint64 // files sent whole
	Bytes     uint64 // bytes of those files
	NotFound  uint64 // requests for a file the root does not hold (iPXE probes autoexec.ipxe)
	Refused   uint64 // requests outside the rules: a write, a path leaving the root, not a regular file, too large
	// Waits counts requests left unanswered because MaxTransfers were running:
	// the client sends its request again (firmware does), and is answered once
	// a transfer has ended. No request is ever refused for capacity.
	Waits   uint64
	Failed  uint64 // transfers abandoned: the client stopped acknowledging, went away, sent an error, or the transfer outlived TransferTimeout
	Errors  uint64 // datagrams at the server's port that start nothing: unparsable, or not a request
	Repeats uint64 // requests dropped because the same client port has a transfer under way
	// Retransmits counts blocks sent again, in completed transfers: after a
	// timeout, or from where a windowsize client said a block was missing.
	Retransmits uint64
}

type tftpCounters struct {
	transfers, bytes, notFound, refused, waits, failed, errors, repeats, retransmits atomic.Uint64
}

// TFTPServer serves the iPXE binaries over TFTP (RFC 1350, with the options of RFC
// 2347: blksize, tsize, timeout and windowsize of RFC 2348, 2349 and 7440),
// read-only and confined to Root. The zero value of every optional field means the
// default.
//
// Files up to a shared bound (maxTFTPCache) are read once into memory and sent
// from there (read again when their size or modification time changes); beyond
// it a file is kept open and each block read with pread at its offset. No
// transfer keeps a copy of its file, netascii ones included (they convert
// block by block): a transfer costs a few hundred bytes and a socket, so
// capacity is bounded by memory and descriptors rather than a small count, and
// a request beyond it is left unanswered (the client asks again) rather than
// refused. Each transfer has a socket of its own, connected
// to the client (its transfer ID, as RFC 1350 asks); on Linux a goroutine per
// core but one (one on 2 cores) polls its share of them with epoll, as dnsmasq
// polls its transfers from one thread, so a block costs a recv of the acknowledgement and a send of the
// next block, with no deadline or timer to set and no goroutine to wake (the
// poller keeps one clock and scans its transfers' deadlines when the earliest
// passes). A block is sent again on a timeout,
// never on a duplicate acknowledgement (no Sorcerer's Apprentice), and for a
// windowsize client from the block after the one it acknowledged. Error
// packets carry the codes of RFC 1350: 1 "file not found", 2 "access violation:
// …", 4 "illegal TFTP operation"; 8 for options the server cannot honour never
// occurs, as options it cannot honour are left out of the OACK.
//
// Requests come from spoofable sources, so none can hold the server for long:
// a negotiated timeout is at most tftpMaxTimeout, the first packet is sent again
// only tftpFirstRetries times tftpFirstTimeout apart until the client
// acknowledges something, and a transfer ends after TransferTimeout however it
// goes.
//
// windowsize helps only the clients that ask for it. iPXE does not (it asks for
// blksize and tsize), nor do tftp-hpa's client and curl: they get one block per
// acknowledgement, and the speed of the lock-step path is what a PXE boot sees.
type TFTPServer struct {
	// Addr is the UDP address to listen on; empty means ":69". A wildcard or IPv4
	// host listens on IPv4 only (PXE is IPv4).
	Addr string
	// Root is the directory served ([boot] tftp_root). Only regular files inside it
	// are sent: absolute paths, "..", symlinks that leave it, devices and
	// directories are refused. Required.
	Root string
	// MaxTransfers bounds the transfers running at once ([boot]
	// tftp_max_transfers); a request beyond it is left unanswered, so the client
	// sends it again, and counted in Waits. 0 means DefaultTFTPMaxTransfers, or
	// half the descriptors the process may open if that is fewer.
	MaxTransfers int
	// TransferTimeout bounds a transfer's whole life ([boot]
	// tftp_transfer_timeout); 0 means DefaultTFTPTransferTimeout.
	TransferTimeout time.Duration
	// ThreadNice, when not 0, runs each poller on its own thread at this nice
	// value (negative: ahead of the rest of the process and the machine), as
	// ProxyDHCP.ThreadNice does for its readers. Without CAP_SYS_NICE a
	// negative value is refused and the pollers run at the process's priority
	// (logged once).
	ThreadNice int
	// Timeout is how long the server waits for an acknowledgement before sending a
	// block again, unless the client negotiates its own (RFC 2349); 0 means 1 s.
	Timeout time.Duration
	// Retries is how many times a block is sent again before the transfer is
	// abandoned; 0 means 5.
	Retries int
	// MaxBlockSize caps the block size a client may negotiate; 0 means what the
	// MTU of the interface the request came in on allows (1468 where the kernel
	// does not say which interface that was).
	MaxBlockSize int
	// Observer hears of every file sent whole; nil discards.
	Observer Observer
	// Logger logs each request at debug level, and unexpected failures and
	// refused requests (at most one a second, with the count left out) at warn;
	// nil discards.
	Logger *slog.Logger

	// cacheLimit overrides maxTFTPCache (tests); 0 means maxTFTPCache.
	cacheLimit int64

	stats      tftpCounters
	active     atomic.Int64 // transfers running
	niceWarned atomic.Bool

	mu    sync.Mutex
	conn  *net.UDPConn
	root  *os.Root
	netns *os.File // the network namespace Listen ran in
	max   int
	log   *slog.Logger
	// refusalLog bounds the warnings about refused requests.
	refusalLog lograte.Limiter
	cache      map[string]*tftpFile
	cached     int64
	mtus       map[int]tftpMTU
	// running are the clients (address and port) with a transfer under way. A
	// firmware that hears nothing for a while sends its RRQ again from the same
	// port; a second transfer to it would answer from a second port, which the
	// client must refuse, so the repeat is dropped and the first transfer's own
	// retransmit answers it.
	running map[netip.AddrPort]bool
}

// tftpMTU is an interface's MTU as read at a time.
type tftpMTU struct {
	mtu  int
	read time.Time
}

// tftpFile is a file's contents as they were when read, with what identifies that
// version.
type tftpFile struct {
	data    []byte   // the contents, when cached
	f       *os.File // else the file, read with pread
	size    int64
	modTime time.Time
	refs    atomic.Int64 // transfers using f

	asciiOnce sync.Once
	asciiSize int64
	asciiErr  error
}

// DefaultTFTPMaxTransfers is MaxTransfers' default. A transfer costs a few
// hundred bytes here, a socket and what its blocks in flight take of the
// kernel's buffers (one 1468-byte block in lock-step): 4096 of them cost
// well under 64 MiB, and serve every machine of a rack-row boot storm at once.
const DefaultTFTPMaxTransfers = 4096

// DefaultTFTPTransferTimeout is TransferTimeout's default: a 32 MiB file at
// blksize 512 takes about a minute on a slow link.
const DefaultTFTPTransferTimeout = 5 * time.Minute

// tftpDefaultLife is a transfer's life when nothing set it (tests that make
// transfers without a server).
const tftpDefaultLife = DefaultTFTPTransferTimeout

// memTFTPFile is a tftpFile of contents in memory.
func memTFTPFile(data []byte) *tftpFile { return &tftpFile{data: data, size: int64(len(data))} }

// readAt fills p from the file at off, all of it or an error.
func (f *tftpFile) readAt(p []byte, off int64) error {
	if f.f == nil {
		if off+int64(len(p)) > int64(len(f.data)) {
			return errTFTPFileChanged
		}
		copy(p, f.data[off:])
		return nil
	}
	n, err := f.f.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		return errTFTPFileChanged
	}
	return fmt.Errorf("reading the file: %w", err)
}

// view returns n bytes of the file at off: from the cached contents, or read
// into scratch.
func (f *tftpFile) view(off int64, n int, scratch []byte) ([]byte, error) {
	if f.f == nil {
		if off+int64(n) > int64(len(f.data)) {
			return nil, errTFTPFileChanged
		}
		return f.data[off : off+int64(n)], nil
	}
	b := scratch[:min(n, len(scratch))]
	return b, f.readAt(b, off)
}

// release says a transfer is done with the file: the last one closes a file
// that is not cached.
func (f *tftpFile) release() {
	if f != nil && f.f != nil && f.refs.Add(-1) == 0 {
		f.f.Close()
	}
}

// Stats returns the counters so far.
func (s *TFTPServer) Stats() TFTPStats {
	return TFTPStats{
		Transfers: s.stats.transfers.Load(),
		Bytes:     s.stats.bytes.Load(),
		NotFound:  s.stats.notFound.Load(),
		Refused:   s.stats.refused.Load(),
		Waits:     s.stats.waits.Load(),
		Failed:    s.stats.failed.Load(),
		Errors:    s.stats.errors.Load(),
		Repeats:   s.stats.repeats.Load(),

		Retransmits: s.stats.retransmits.Load(),
	}
}

// ListenAndServe listens, then serves until ctx is done.
func (s *TFTPServer) ListenAndServe(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Listen opens Root and the socket. It may run on a thread inside another network
// namespace than Serve's: Serve opens each transfer's socket in the namespace
// Listen ran in.
func (s *TFTPServer) Listen() error {
	if s.Root == "" {
		return errors.New("TFTP: no Root directory")
	}
	root, err := os.OpenRoot(s.Root)
	if err != nil {
		return fmt.Errorf("TFTP root: %w", err)
	}
	addr := cmpOr(s.Addr, ":69")
	a, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		root.Close()
		return fmt.Errorf("TFTP address %s: %w", addr, err)
	}
	ns, err := currentNetns()
	if err != nil {
		root.Close()
		return err
	}
	// PXE is IPv4. A wildcard "udp" socket is dual-stack, and blocks sized for its
	// IPv6 headers would cost an IPv4 client 20 bytes of each (1452 for 1468).
	network := "udp6"
	if a.IP == nil || a.IP.To4() != nil {
		network = "udp4"
	}
	conn, err := net.ListenUDP(network, a)
	if err == nil {
		err = tftpEnablePktinfo(conn)
		if err != nil {
			conn.Close()
		}
	}
	if err != nil {
		root.Close()
		if ns != nil {
			ns.Close()
		}
		return fmt.Errorf("TFTP: listening on %s: %w", addr, err)
	}
	max := s.MaxTransfers
	if max <= 0 {
		max = defaultTFTPMaxTransfers()
	}
	s.mu.Lock()
	s.conn, s.root, s.netns, s.max = conn, root, ns, max
	s.log = s.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.cache = map[string]*tftpFile{}
	s.mtus = map[int]tftpMTU{}
	s.running = map[netip.AddrPort]bool{}
	s.mu.Unlock()
	return nil
}

// LocalAddr returns the address Listen bound.
func (s *TFTPServer) LocalAddr() netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return netip.AddrPort{}
	}
	return s.conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Serve answers requests until ctx is done, then waits for the transfers running
// to finish or time out.
func (s *TFTPServer) Serve(ctx context.Context) error {
	s.mu.Lock()
	conn, root, ns := s.conn, s.root, s.netns
	s.mu.Unlock()
	if conn == nil {
		return errors.New("TFTP: Serve before Listen")
	}
	defer root.Close()
	if ns != nil {
		defer ns.Close()
	}
	// A poller per core but one (tftpPollers): a poller runs its transfers
	// from one goroutine, and a storm of lock-step clients is all syscalls,
	// which more cores serve.
	pollers := make([]*tftpPoller, tftpPollers())
	for i := range pollers {
		p, err := newTFTPPoller(s)
		if err != nil {
			for _, p := range pollers[:i] {
				p.close()
				p.run()
			}
			conn.Close()
			return fmt.Errorf("TFTP: %w", err)
		}
		pollers[i] = p
	}
	var polled sync.WaitGroup
	for _, p := range pollers {
		polled.Go(p.run)
	}
	errc := make(chan error, 1)
	go func() { errc <- serveInNetns(ns, func() error { return s.serveRequests(conn, pollers) }) }()
	var serr error
	select {
	case serr = <-errc:
		conn.Close()
	case <-ctx.Done():
		conn.Close()
		<-errc
	}
	for _, p := range pollers {
		p.close()
	}
	polled.Wait()
	if serr != nil {
		return fmt.Errorf("TFTP: %w", serr)
	}
	return nil
}

// serveRequests reads requests at the server's port until conn is closed. It runs
// on a thread in the namespace Listen ran in: the transfer sockets it opens, and
// the interface it asks the MTU of, must be there.
func (s *TFTPServer) serveRequests(conn *net.UDPConn, pollers []*tftpPoller) error {
	next := 0
	buf := make([]byte, 2048)
	oob := make([]byte, 256)
	for {
		n, oobn, _, from, err := conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var errno syscall.Errno
			if errors.As(err, &errno) && errno.Temporary() {
				continue
			}
			return err
		}
		local, ifindex := tftpParsePktinfo(oob[:oobn])
		if s.request(buf[:n], from, local, ifindex, pollers[next]) {
			next = (next + 1) % len(pollers)
		}
	}
}

// Errors the client reads in the error packet: fixed texts that name no path.
// Only these texts reach the client (tftpClientMessage); what they are wrapped
// with is for the server's log.
var (
	errTFTPNotFound = errors.New("file not found")
	errTFTPAccess   = errors.New("access violation")
	errTFTPReadOnly = errors.New("access violation: this server is read-only")
	errTFTPIllegal  = errors.New("illegal TFTP operation")
)

// tftpErrorCode is the RFC 1350 code an error packet carries for err.
func tftpErrorCode(err error) uint16 {
	switch {
	case errors.Is(err, errTFTPNotFound):
		return 1
	case errors.Is(err, errTFTPAccess), errors.Is(err, errTFTPReadOnly):
		return 2
	case errors.Is(err, errTFTPIllegal):
		return 4
	}
	return 0
}

// request answers one datagram at the server's port: a transfer handed to the
// poller p (started says so), an error packet, or nothing.
func (s *TFTPServer) request(b []byte, from netip.AddrPort, local netip.Addr, ifindex int, p *tftpPoller) (started bool) {
	debug := s.log.Enabled(context.Background(), slog.LevelDebug)
	req, err := parseTFTPRequest(b)
	if err != nil {
		s.stats.errors.Add(1)
		if debug {
			s.log.Debug("TFTP: request failed", "from", from, "err", err)
		}
		// Only a datagram that claims to be a request gets an answer: answering
		// stray ACKs or errors could start a loop with another server.
		if len(b) >= 2 && (b[1] == tftpOpRRQ || b[1] == tftpOpWRQ) && b[0] == 0 {
			s.sendError(local, from, errTFTPIllegal)
		}
		return false
	}
	// Requests are read one at a time, so nothing starts a transfer for from
	// between this check and p.add below.
	s.mu.Lock()
	repeat := s.running[from]
	s.mu.Unlock()
	if repeat {
		s.stats.repeats.Add(1)
		if debug {
			s.log.Debug("TFTP: dropping a repeated request; its transfer is under way", "from", from, "file", req.name)
		}
		return false
	}
	if req.op == tftpOpWRQ {
		s.stats.refused.Add(1)
		if debug {
			s.log.Debug("TFTP: write refused", "from", from, "file", req.name)
		}
		s.sendError(local, from, errTFTPReadOnly)
		return false
	}
	if req.mode != "octet" && req.mode != "netascii" {
		s.stats.refused.Add(1)
		if debug {
			s.log.Debug("TFTP: refused", "from", from, "file", req.name, "mode", req.mode)
		}
		s.sendError(local, from, errTFTPIllegal)
		return false
	}
	if n := s.active.Add(1); n > int64(s.max) {
		// No error packet: firmware gives up the boot on one. The client sends
		// its request again after its timeout, by when transfers have ended
		// (each is bounded in time).
		s.active.Add(-1)
		s.stats.waits.Add(1)
		if debug {
			s.log.Debug("TFTP: at capacity, leaving the request for the client to send again", "from", from, "file", req.name, "max_transfers", s.max)
		}
		return false
	}
	f, err := s.open(req.name)
	if err != nil {
		s.active.Add(-1)
		switch {
		case errors.Is(err, errTFTPNotFound):
			s.stats.notFound.Add(1)
			if debug {
				s.log.Debug("TFTP: not found", "from", from, "file", req.name)
			}
		default:
			// The client reads only "access violation"; the detail (which
			// check refused it, an escaping link's path) is the operator's,
			// at most a line a second: anyone on the network can send these.
			s.stats.refused.Add(1)
			if ok, suppressed := s.refusalLog.Allow(); ok {
				s.log.Warn("TFTP: refused", "from", from, "file", req.name, "err", err, "suppressed", suppressed)
			} else if debug {
				s.log.Debug("TFTP: refused", "from", from, "file", req.name, "err", err)
			}
		}
		s.sendError(local, from, err)
		return false
	}
	size := f.size
	if req.mode == "netascii" {
		if size, err = f.netasciiSize(make([]byte, 32<<10)); err != nil {
			f.release()
			s.active.Add(-1)
			s.stats.refused.Add(1)
			s.sendError(local, from, fmt.Errorf("%w: reading failed", errTFTPAccess))
			return false
		}
	}
	t := newTFTPTransfer(req, f, size, s.negotiate(req, size, s.maxBlockSize(from, ifindex)))
	t.remote = from
	t.retries = s.retries()
	t.life = orDuration(s.TransferTimeout, DefaultTFTPTransferTimeout)
	if err := t.open(local, from); err != nil {
		f.release()
		s.active.Add(-1)
		s.stats.failed.Add(1)
		s.log.Warn("TFTP: opening a transfer socket", "to", from, "err", err)
		return false
	}
	s.mu.Lock()
	s.running[from] = true
	s.mu.Unlock()
	p.add(t)
	return true
}

// sendError answers from with an error packet from a socket of its own, as a
// transfer would have.
func (s *TFTPServer) sendError(local netip.Addr, to netip.AddrPort, err error) {
	t := &tftpTransfer{}
	if oerr := t.open(local, to); oerr != nil {
		return
	}
	t.write(tftpErrorPacket(nil, err))
	t.close()
}

// maxBlockSize is the largest block a client at from may have: what the MTU of
// the interface its request came in on carries, and MaxBlockSize.
func (s *TFTPServer) maxBlockSize(from netip.AddrPort, ifindex int) int {
	if s.MaxBlockSize > 0 {
		return min(s.MaxBlockSize, tftpMaxBlksize)
	}
	mtu := 1500
	if ifindex > 0 {
		now := time.Now()
		s.mu.Lock()
		m, ok := s.mtus[ifindex]
		s.mu.Unlock()
		// An MTU is read again after a while: interfaces change, and asking the
		// kernel for every request costs a netlink round trip.
		if !ok || now.Sub(m.read) > 10*time.Second {
			if ifi, err := net.InterfaceByIndex(ifindex); err == nil && ifi.MTU > 0 {
				m = tftpMTU{mtu: ifi.MTU, read: now}
				s.mu.Lock()
				s.mtus[ifindex] = m
				s.mu.Unlock()
				ok = true
			}
		}
		if ok {
			mtu = m.mtu
		}
	}
	hdr := 28 // IPv4 and UDP headers
	if from.Addr().Is6() && !from.Addr().Is4In6() {
		hdr = 48
	}
	return max(min(mtu-hdr, tftpMaxBlksize), 512)
}

func (s *TFTPServer) timeout() time.Duration { return orDuration(s.Timeout, time.Second) }

func (s *TFTPServer) retries() int {
	if s.Retries <= 0 {
		return 5
	}
	return s.Retries
}

// finished counts and reports a transfer that ended, whole or not, and frees its
// slot.
func (s *TFTPServer) finished(t *tftpTransfer, err error) {
	s.active.Add(-1)
	t.file.release()
	s.mu.Lock()
	delete(s.running, t.remote)
	s.mu.Unlock()
	debug := s.log.Enabled(context.Background(), slog.LevelDebug)
	if err != nil {
		s.stats.failed.Add(1)
		if debug {
			s.log.Debug("TFTP: transfer failed", "from", t.remote, "file", t.name, "sent", t.bytesAcked(), "err", err)
		}
		return
	}
	s.stats.transfers.Add(1)
	s.stats.bytes.Add(uint64(t.size))
	s.stats.retransmits.Add(t.retransmits)
	if debug {
		s.log.Debug("TFTP: sent", "to", t.remote, "file", t.name, "bytes", t.size)
	}
	if s.Observer != nil {
		s.Observer.Observe(Event{Time: time.Now(), Served: ServedTFTP, IP: t.remote.Addr().Unmap(), Arch: -1, File: t.name})
	}
}

// open returns the file name under Root: its contents from memory while the
// file is unchanged and the cache has room, else the open file, which the
// caller releases.
func (s *TFTPServer) open(name string) (*tftpFile, error) {
	clean, err := cleanTFTPPath(name)
	if err != nil {
		return nil, err
	}
	// Stat before opening: opening a FIFO would block, and opening a device could
	// do anything.
	fi, err := s.root.Stat(clean)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errTFTPNotFound
		}
		return nil, fmt.Errorf("%w: %w", errTFTPAccess, err)
	}
	if err := servable(clean, fi); err != nil {
		return nil, fmt.Errorf("%w: %w", errTFTPAccess, err)
	}
	s.mu.Lock()
	c := s.cache[clean]
	s.mu.Unlock()
	if c != nil && c.size == fi.Size() && c.modTime.Equal(fi.ModTime()) {
		return c, nil
	}
	// O_NONBLOCK in case the file was swapped for a FIFO since the Stat.
	f, err := s.root.OpenFile(clean, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errTFTPAccess, err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
		}
	}()
	fi, err = f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errTFTPAccess, err)
	}
	if err := servable(clean, fi); err != nil {
		return nil, fmt.Errorf("%w: %w", errTFTPAccess, err)
	}
	if fi.Size() > MaxTFTPFile {
		return nil, fmt.Errorf("%w: larger than %d bytes", errTFTPAccess, MaxTFTPFile)
	}
	s.mu.Lock()
	if old := s.cache[clean]; old != nil {
		s.cached -= int64(len(old.data))
		delete(s.cache, clean)
	}
	room := s.cached+fi.Size() <= cmp.Or(s.cacheLimit, maxTFTPCache)
	if room {
		// Reserve the room now, so that concurrent requests for other large
		// files do not all read theirs in.
		s.cached += fi.Size()
	}
	s.mu.Unlock()
	if !room {
		// Beyond the cache the transfer reads the file block by block: no
		// request reads a whole file into memory of its own.
		keep = true
		c = &tftpFile{f: f, size: fi.Size(), modTime: fi.ModTime()}
		c.refs.Store(1)
		return c, nil
	}
	data, err := io.ReadAll(io.LimitReader(f, fi.Size()+1))
	if err != nil || int64(len(data)) != fi.Size() {
		s.mu.Lock()
		s.cached -= fi.Size()
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: reading failed", errTFTPAccess)
	}
	c = &tftpFile{data: data, size: fi.Size(), modTime: fi.ModTime()}
	s.mu.Lock()
	if old := s.cache[clean]; old != nil {
		// Another request read it meanwhile: keep one.
		s.cached -= int64(len(old.data))
	}
	s.cache[clean] = c
	s.mu.Unlock()
	return c, nil
}

// cleanTFTPPath checks a requested file name: a relative path of plain elements,
// printable ASCII, no "." or ".." elements, no backslashes. What it returns is safe
// to hand to os.Root, which refuses symlinks leaving the root on its own.
func cleanTFTPPath(name string) (string, error) {
	if name == "" || len(name) > 255 {
		return "", fmt.Errorf("%w: empty or overlong file name", errTFTPAccess)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x21 || c > 0x7e || c == '\\' {
			return "", fmt.Errorf("%w: file name has a space, a control character, a backslash or non-ASCII", errTFTPAccess)
		}
	}
	if name[0] == '/' {
		return "", fmt.Errorf("%w: absolute path", errTFTPAccess)
	}
	for elem := range strings.SplitSeq(name, "/") {
		if elem == "" || elem == "." || elem == ".." {
			return "", fmt.Errorf("%w: path element %q", errTFTPAccess, elem)
		}
	}
	return name, nil
}

func orDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
