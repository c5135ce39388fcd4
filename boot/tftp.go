package boot

import (
	"bytes"
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

	"github.com/pin/tftp/v3"
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
	Busy      uint64 // requests refused because MaxTransfers were running
	Failed    uint64 // transfers abandoned: the client stopped acknowledging, or sent an error
	Errors    uint64 // packets the TFTP library could not use: unparsable, or an opcode that starts nothing
	// Retransmits counts blocks sent again after a timeout, in completed transfers.
	Retransmits uint64
}

type tftpCounters struct {
	transfers, bytes, notFound, refused, busy, failed, errors, retransmits atomic.Uint64
}

// TFTPServer serves the iPXE binaries over TFTP (RFC 1350, with the blksize and
// tsize options of RFC 2348 and 2349), read-only and confined to Root. The zero value
// of every optional field means the default.
//
// Files are read once into memory and sent from there (read again when their size
// or modification time changes). The server is built on github.com/pin/tftp/v3,
// whose limits show through: there is no windowsize (RFC 7440), so each block waits
// for its acknowledgement even for a client that offers a window; every error packet
// carries code 1, with a message saying what is wrong ("file not found", "access
// violation: …", "server busy, try again"); and for a request whose interface the
// kernel does not report (seen on loopback, a few requests in a thousand) the
// library grants 512-byte blocks whatever the client asked for.
type TFTPServer struct {
	// Addr is the UDP address to listen on; empty means ":69".
	Addr string
	// Root is the directory served ([boot] tftp_root). Only regular files inside it
	// are sent: absolute paths, "..", symlinks that leave it, devices and
	// directories are refused. Required.
	Root string
	// MaxTransfers bounds the transfers running at once; a request beyond it gets
	// an error packet at once rather than waiting. 0 means 64.
	MaxTransfers int
	// Timeout is how long the server waits for an acknowledgement before sending a
	// block again; 0 means 1 s.
	Timeout time.Duration
	// Retries is how many times a block is sent before the transfer is abandoned;
	// 0 means 5.
	Retries int
	// MaxBlockSize caps the block size a client may negotiate; 0 means what the
	// interface's MTU allows.
	MaxBlockSize int
	// Observer hears of every file sent whole; nil discards.
	Observer Observer
	// Logger logs each request at debug level and unexpected failures at warn; nil
	// discards.
	Logger *slog.Logger

	stats tftpCounters

	mu     sync.Mutex
	conn   *net.UDPConn
	srv    *tftp.Server
	root   *os.Root
	netns  *os.File // the network namespace Listen ran in
	sem    chan struct{}
	log    *slog.Logger
	cache  map[string]*tftpFile
	cached int64
}

// tftpFile is a file's contents as they were when read, with what identifies that
// version.
type tftpFile struct {
	data    []byte
	size    int64
	modTime time.Time
}

// Stats returns the counters so far.
func (s *TFTPServer) Stats() TFTPStats {
	return TFTPStats{
		Transfers: s.stats.transfers.Load(),
		Bytes:     s.stats.bytes.Load(),
		NotFound:  s.stats.notFound.Load(),
		Refused:   s.stats.refused.Load(),
		Busy:      s.stats.busy.Load(),
		Failed:    s.stats.failed.Load(),
		Errors:    s.stats.errors.Load(),

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
	// PXE is IPv4. A wildcard "udp" socket is dual-stack, and pin/tftp then sizes
	// blocks for IPv6 (an IPv4 client asking for 1468 gets 1452).
	network := "udp6"
	if a.IP == nil || a.IP.To4() != nil {
		network = "udp4"
	}
	conn, err := net.ListenUDP(network, a)
	if err != nil {
		root.Close()
		if ns != nil {
			ns.Close()
		}
		return fmt.Errorf("TFTP: listening on %s: %w", addr, err)
	}
	max := s.MaxTransfers
	if max <= 0 {
		max = 64
	}
	srv := tftp.NewServer(s.read, s.write)
	srv.SetTimeout(orDuration(s.Timeout, time.Second))
	srv.SetRetries(s.Retries)
	// Retransmit as soon as the timeout says a block was lost; the library's
	// default adds a random pause of up to a second on top.
	srv.SetBackoff(func(int) time.Duration { return 0 })
	if s.MaxBlockSize > 0 {
		srv.SetBlockSize(s.MaxBlockSize)
	}
	srv.SetHook(tftpHook{s})
	s.mu.Lock()
	s.conn, s.srv, s.root, s.netns = conn, srv, root, ns
	s.sem = make(chan struct{}, max)
	s.log = s.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.cache = map[string]*tftpFile{}
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
	conn, srv, root, ns := s.conn, s.srv, s.root, s.netns
	s.mu.Unlock()
	if conn == nil {
		return errors.New("TFTP: Serve before Listen")
	}
	defer root.Close()
	if ns != nil {
		defer ns.Close()
	}
	errc := make(chan error, 1)
	go func() { errc <- serveInNetns(ns, func() error { return srv.Serve(conn) }) }()
	select {
	case err := <-errc:
		return fmt.Errorf("TFTP: %w", err)
	case <-ctx.Done():
	}
	srv.Shutdown()
	<-errc
	return nil
}

// Errors the client reads in the error packet: fixed texts that name no path.
var (
	errTFTPNotFound = errors.New("file not found")
	errTFTPAccess   = errors.New("access violation")
	errTFTPBusy     = errors.New("server busy, try again")
	errTFTPReadOnly = errors.New("access violation: this server is read-only")
)

func (s *TFTPServer) read(filename string, rf io.ReaderFrom) error {
	ot, _ := rf.(tftp.OutgoingTransfer)
	var remote netip.AddrPort
	if ot != nil {
		a := ot.RemoteAddr()
		remote = a.AddrPort()
	}
	debug := s.log.Enabled(context.Background(), slog.LevelDebug)
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	default:
		s.stats.busy.Add(1)
		if debug {
			s.log.Debug("TFTP: busy", "from", remote, "file", filename)
		}
		return errTFTPBusy
	}
	f, err := s.open(filename)
	if err != nil {
		switch {
		case errors.Is(err, errTFTPNotFound):
			s.stats.notFound.Add(1)
		default:
			s.stats.refused.Add(1)
		}
		if debug {
			s.log.Debug("TFTP: refused", "from", remote, "file", filename, "err", err)
		}
		return err
	}
	n, err := rf.ReadFrom(bytes.NewReader(f.data))
	if err != nil {
		s.stats.failed.Add(1)
		if debug {
			s.log.Debug("TFTP: transfer failed", "from", remote, "file", filename, "sent", n, "err", err)
		}
		// The library has told the client already.
		return nil
	}
	s.stats.transfers.Add(1)
	s.stats.bytes.Add(uint64(n))
	if debug {
		s.log.Debug("TFTP: sent", "to", remote, "file", filename, "bytes", n)
	}
	if s.Observer != nil {
		s.Observer.Observe(Event{Time: time.Now(), Served: ServedTFTP, IP: remote.Addr().Unmap(), Arch: -1, File: filename})
	}
	return nil
}

// write refuses every write request, with an error packet before any data moves.
func (s *TFTPServer) write(filename string, wt io.WriterTo) error {
	s.stats.refused.Add(1)
	if s.log.Enabled(context.Background(), slog.LevelDebug) {
		var from netip.AddrPort
		if it, ok := wt.(tftp.IncomingTransfer); ok {
			a := it.RemoteAddr()
			from = a.AddrPort()
		}
		s.log.Debug("TFTP: write refused", "from", from, "file", filename)
	}
	return errTFTPReadOnly
}

// open returns the contents of name under Root, from memory while the file is
// unchanged.
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
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: not a regular file", errTFTPAccess)
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
	defer f.Close()
	fi, err = f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errTFTPAccess, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: not a regular file", errTFTPAccess)
	}
	if fi.Size() > MaxTFTPFile {
		return nil, fmt.Errorf("%w: larger than %d bytes", errTFTPAccess, MaxTFTPFile)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxTFTPFile+1))
	if err != nil || len(data) > MaxTFTPFile {
		return nil, fmt.Errorf("%w: reading failed", errTFTPAccess)
	}
	c = &tftpFile{data: data, size: fi.Size(), modTime: fi.ModTime()}
	s.mu.Lock()
	if old := s.cache[clean]; old != nil {
		s.cached -= int64(len(old.data))
		delete(s.cache, clean)
	}
	if s.cached+int64(len(data)) <= maxTFTPCache {
		s.cache[clean] = c
		s.cached += int64(len(data))
	}
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

// tftpHook counts what the library reports beyond the read handler.
type tftpHook struct{ s *TFTPServer }

func (h tftpHook) OnSuccess(st tftp.TransferStats) {
	if st.DatagramsSent > st.DatagramsAcked {
		h.s.stats.retransmits.Add(uint64(st.DatagramsSent - st.DatagramsAcked))
	}
}

func (h tftpHook) OnFailure(st tftp.TransferStats, err error) {
	// A failure with a file name is a transfer the read or write handler has
	// counted already.
	if st.Filename != "" {
		return
	}
	h.s.stats.errors.Add(1)
	if h.s.log != nil && h.s.log.Enabled(context.Background(), slog.LevelDebug) {
		h.s.log.Debug("TFTP: request failed", "from", st.RemoteAddr, "err", err)
	}
}

func orDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
