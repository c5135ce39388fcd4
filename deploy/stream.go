package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"

	"github.com/better-compute/bcd/protocol"
)

// source is the served stream: it hashes and counts every byte, refuses more than
// the promised size, and cancels the request when no byte arrives for stall. A
// decoder may read it from its own goroutine while progress and errors look at it,
// hence the locks: hashMu for the digest, mu for the rest, so that progress never
// waits for a chunk's hashing.
type source struct {
	body     io.ReadCloser
	limit    int64
	stall    *time.Timer
	stallDur time.Duration

	hashMu sync.Mutex
	hash   hash.Hash
	hashed int64 // bytes hashed
	// deferHash leaves hashing to the pipeline (hashChunk), off the reading
	// goroutine: for a raw image the served bytes are the image's, and hashing
	// them beside the reads and writes rather than between them is what lets a
	// deploy keep up with dd.
	deferHash bool

	mu      sync.Mutex
	n       int64 // bytes read
	err     error // the first read error other than EOF: the network's fault
	eof     bool
	tooLong bool
}

// hashInline switches to hashing as bytes are read, hashing first what was read
// and not yet hashed (what a bufio.Reader holds after a Peek).
func (s *source) hashInline(pending []byte) error {
	s.mu.Lock()
	n := s.n
	s.mu.Unlock()
	s.hashMu.Lock()
	defer s.hashMu.Unlock()
	if s.hashed+int64(len(pending)) != n {
		return fmt.Errorf("internal error: %d bytes read, %d hashed, %d pending", n, s.hashed, len(pending))
	}
	s.hash.Write(pending)
	s.hashed = n
	s.deferHash = false
	return nil
}

func (s *source) hashChunk(p []byte) {
	s.hashMu.Lock()
	defer s.hashMu.Unlock()
	s.hash.Write(p)
	s.hashed += int64(len(p))
}

func (s *source) Read(p []byte) (int, error) {
	s.mu.Lock()
	n0, err0 := s.n, s.err
	s.mu.Unlock()
	if err0 != nil {
		return 0, err0
	}
	if n0 >= s.limit {
		// Look one byte past the promised size: a longer stream is a wrong image.
		var one [1]byte
		n, err := s.body.Read(one[:])
		s.mu.Lock()
		defer s.mu.Unlock()
		if n > 0 {
			// Not hashed: the digest in the error is over the promised bytes.
			s.n += int64(n)
			s.tooLong = true
			s.err = fmt.Errorf("the server sent more than the %d bytes promised", s.limit)
			return 0, s.err
		}
		if err == nil {
			return 0, nil
		}
		return 0, s.noteErr(err)
	}
	if int64(len(p)) > s.limit-n0 {
		p = p[:s.limit-n0]
	}
	n, err := s.body.Read(p)
	if n > 0 {
		s.hashMu.Lock()
		if !s.deferHash {
			s.hash.Write(p[:n])
			s.hashed += int64(n)
		}
		s.hashMu.Unlock()
		s.stall.Reset(s.stallDur)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n += int64(n)
	if err != nil {
		return n, s.noteErr(err)
	}
	return n, nil
}

func (s *source) noteErr(err error) error {
	if err == io.EOF {
		s.eof = true
		return err
	}
	if s.err == nil {
		s.err = stripURLError(err)
	}
	return err
}

// sourceState is what has come so far. Once the pipeline has stopped, every
// byte received is hashed (but one past the promised size).
type sourceState struct {
	hashed  int64
	sum     string
	err     error // the network's
	eof     bool  // the stream ended
	tooLong bool  // the stream went on past the promised size
}

func (s *source) state() sourceState {
	s.hashMu.Lock()
	hashed, sum := s.hashed, hex.EncodeToString(s.hash.Sum(nil))
	s.hashMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return sourceState{hashed, sum, s.err, s.eof, s.tooLong}
}

func (s *source) received() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// magics of the formats a stream can be told by.
var magics = []struct {
	format string
	magic  []byte
}{
	{protocol.FormatGzip, []byte{0x1f, 0x8b}},
	{protocol.FormatXZ, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
	{protocol.FormatZstd, []byte{0x28, 0xb5, 0x2f, 0xfd}},
	{protocol.FormatQCOW2, []byte{'Q', 'F', 'I', 0xfb}},
}

// sniffFormat tells a stream's format by its first bytes; a stream that starts
// with none of the magics is raw.
func sniffFormat(head []byte) string {
	for _, m := range magics {
		if bytes.HasPrefix(head, m.magic) {
			return m.format
		}
	}
	return protocol.FormatRaw
}

// decoder turns the served stream into the disk image.
type decoder struct {
	io.Reader
	// finish waits for what runs beside the decoder (xz) and reports its failure.
	finish func() error
	// close stops the decoder and waits for every goroutine that reads the source.
	closeFn func()
	once    sync.Once
}

func (d *decoder) close() { d.once.Do(d.closeFn) }

func (d *Deployer) newDecoder(ctx context.Context, format string, r io.Reader) (*decoder, error) {
	nop := func() error { return nil }
	switch format {
	case protocol.FormatRaw:
		return &decoder{Reader: r, finish: nop, closeFn: func() {}}, nil
	case protocol.FormatGzip:
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return &decoder{Reader: z, finish: nop, closeFn: func() { z.Close() }}, nil
	case protocol.FormatZstd:
		z, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(1<<30))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return &decoder{Reader: z, finish: nop, closeFn: z.Close}, nil
	case protocol.FormatXZ:
		if !d.PureGoXZ {
			if p, err := exec.LookPath("xz"); err == nil {
				return externalXZ(ctx, p, r)
			}
		}
		// ulikunitz/xz decodes at a quarter of xz's speed here, but works anywhere.
		z, err := xz.NewReader(bufio.NewReaderSize(r, 1<<20))
		if err != nil {
			return nil, fmt.Errorf("xz: %w", err)
		}
		return &decoder{Reader: z, finish: nop, closeFn: func() {}}, nil
	}
	return nil, failf(reasonNotImplemented, "%s not implemented", format)
}

// externalXZ runs xz -dc -T0 fed from r: several times faster than the Go decoder,
// and multi-threaded on images compressed in blocks.
func externalXZ(ctx context.Context, path string, r io.Reader) (*decoder, error) {
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, path, "-dc", "-T0")
	cmd.Env = []string{"LC_ALL=C"}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	var stderr cappedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("xz: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// A failed read is recorded by the source; a failed write means xz quit,
		// and its exit status says why.
		io.Copy(stdin, r)
		stdin.Close()
	}()
	var once sync.Once
	var waitErr error
	finish := func() error {
		once.Do(func() {
			wg.Wait()
			waitErr = cmd.Wait()
			if waitErr != nil {
				waitErr = fmt.Errorf("xz: %w: %s", waitErr, firstLines(stderr.String(), 3))
			}
		})
		return waitErr
	}
	return &decoder{
		Reader: stdout,
		finish: finish,
		closeFn: func() {
			cancel()
			finish()
		},
	}, nil
}

// ring is the decoder running ahead of the writer: a few big buffers circulate
// between a goroutine that fills them and the writer that empties them.
type chunk struct {
	buf []byte
	n   int
}

// copyImage streams the decoded image into the target: everything but the first
// wipeSize bytes, which it returns instead, to be written only once the whole image
// is verified; until then the disk has no partition table and cannot boot.
//
// abort stops the download and the decoder, so that a reader blocked on the network
// returns when the writer fails.
func (d *Deployer) copyImage(ctx context.Context, r io.Reader, t *target, imageSize int64, rep *reporter, src *source, abort func()) (head []byte, n int64, err error) {
	bufSize, nbuf := d.BufferSize, d.Buffers
	if bufSize <= 0 {
		bufSize = 4 * mib
	}
	bufSize = (bufSize + wipeSize - 1) / wipeSize * wipeSize
	if nbuf < 2 {
		nbuf = 8
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	free := make(chan []byte, nbuf)
	full := make(chan chunk, nbuf)
	for i := 0; i < nbuf; i++ {
		free <- alignedBuffer(bufSize)
	}
	var readErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(full)
		for {
			var buf []byte
			select {
			case buf = <-free:
			case <-ctx.Done():
				return
			}
			n, err := io.ReadFull(r, buf)
			if n > 0 {
				select {
				case full <- chunk{buf, n}:
				case <-ctx.Done():
					return
				}
			}
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return
			}
			if err != nil {
				readErr = err
				return
			}
		}
	}()
	// For a raw image the chunks are the served bytes: hash them in a stage of
	// their own, between reader and writer.
	chunks := full
	hashDone := make(chan struct{})
	if src.deferHash {
		hashed := make(chan chunk, nbuf)
		chunks = hashed
		go func() {
			defer close(hashDone)
			defer close(hashed)
			for c := range full {
				// Every chunk read is hashed, even after a failure, so the digest
				// in the error covers every byte received.
				src.hashChunk(c.buf[:c.n])
				select {
				case hashed <- c:
				case <-ctx.Done():
				}
			}
		}()
	} else {
		close(hashDone)
	}
	defer func() {
		if err != nil {
			abort()
		}
		cancel()
		<-done
		<-hashDone
		if err == nil && readErr != nil {
			err = &decodeError{readErr}
		}
	}()

	headLen := min(int64(wipeSize), imageSize)
	head = alignedBuffer(int(headLen))

	// Writers: a few writes in flight keep the device busy while one completes
	// (O_DIRECT writes are synchronous); order does not matter, each chunk knows
	// its offset.
	type job struct {
		buf []byte
		p   []byte
		off int64
	}
	nw := d.Writers
	if nw <= 0 {
		nw = 2
	}
	jobs := make(chan job)
	var written atomic.Int64
	var writeErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for i := 0; i < nw; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			zeros := make([]byte, zeroBlock)
			for j := range jobs {
				if _, err := t.writeSkippingZeros(j.p, j.off, zeros); err != nil {
					errOnce.Do(func() { writeErr = err; cancel() })
				}
				written.Add(int64(len(j.p)))
				free <- j.buf
			}
		}()
	}
	stopWriters := func() error {
		if jobs != nil {
			close(jobs)
			jobs = nil
			wg.Wait()
		}
		return writeErr
	}
	defer stopWriters()

	var off int64
	for c := range chunks {
		p := c.buf[:c.n]
		if off+int64(len(p)) > imageSize {
			return nil, off, &sizeError{fmt.Errorf("the image is larger than the %d bytes of image_size", imageSize)}
		}
		if off < headLen {
			k := copy(head[off:], p)
			p, off = p[k:], off+int64(k)
			written.Add(int64(k))
		}
		select {
		case jobs <- job{buf: c.buf, p: p, off: off}:
		case <-ctx.Done():
			if err := stopWriters(); err != nil {
				return nil, off, err
			}
			return nil, off, ctx.Err()
		}
		off += int64(len(p))
		rep.update(written.Load(), src.received(), false)
	}
	if err := stopWriters(); err != nil {
		return nil, off, err
	}
	if err := ctx.Err(); err != nil {
		return nil, off, err
	}
	if readErr != nil {
		return nil, off, &decodeError{readErr}
	}
	if off != imageSize {
		return nil, off, &shortError{fmt.Errorf("the image is %d bytes, image_size says %d", off, imageSize)}
	}
	return head, off, nil
}

type decodeError struct{ err error }

func (e *decodeError) Error() string { return e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

// shortError: the decoder's output ended before image_size; the decoder has
// finished, and may say why.
type shortError struct{ err error }

func (e *shortError) Error() string { return e.err.Error() }
func (e *shortError) Unwrap() error { return e.err }

type sizeError struct{ err error }

func (e *sizeError) Error() string { return e.err.Error() }
func (e *sizeError) Unwrap() error { return e.err }

// fetch starts the download: a 200 answer whose length, when it gives one, is the
// promised size. Nothing has touched the disk yet when this fails.
func (d *Deployer) fetch(ctx context.Context, p *Request) (*http.Response, error) {
	img := p.Image
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, img.URL, nil)
	if err != nil {
		return nil, failf(reasonInvalid, "image.url %s: %v", protocol.RedactURL(img.URL), stripURLError(err))
	}
	// The digest covers the bytes as served: a transparent gzip would change them.
	req.Header.Set("Accept-Encoding", "identity")
	client := &http.Client{Transport: d.transport(p), CheckRedirect: func(r *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("more than 5 redirects")
		}
		if r.URL.Scheme != "https" && !d.AllowHTTP {
			return errors.New("redirected to a URL that is not https")
		}
		return nil
	}}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, &Error{Reason: reasonCancelled, Err: fmt.Errorf("deploy: image %s: %w", protocol.RedactURL(img.URL), ctx.Err())}
		}
		return nil, failf(reasonDownload, "image %s: %v", protocol.RedactURL(img.URL), stripURLError(err))
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, failf(reasonDownload, "image %s: HTTP %s", protocol.RedactURL(img.URL), resp.Status)
	}
	if resp.ContentLength >= 0 && resp.ContentLength != img.Size {
		resp.Body.Close()
		return nil, &Error{Reason: reasonSize, Err: &StreamError{URL: protocol.RedactURL(img.URL), Problem: "size mismatch",
			ExpectedSHA256: img.SHA256, ExpectedSize: img.Size,
			Err: fmt.Errorf("the server announces %d bytes, expected %d", resp.ContentLength, img.Size)}}
	}
	return resp, nil
}

// proxyFor is the proxy a deploy fetches through: the params', else the Deployer's.
func (d *Deployer) proxyFor(p *Request) *url.URL {
	if p.Proxy != "" {
		if u, err := parseProxy(p.Proxy); err == nil {
			return u
		}
	}
	return d.Proxy
}

func (d *Deployer) transport(p *Request) http.RoundTripper {
	if d.Transport != nil {
		return d.Transport
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // only the proxy we are told of, never the environment's
	if proxy := d.proxyFor(p); proxy != nil {
		tr.Proxy = http.ProxyURL(proxy)
	}
	if d.TLSConfig != nil {
		tr.TLSClientConfig = d.TLSConfig.Clone()
	}
	tr.ResponseHeaderTimeout = 60 * time.Second
	tr.DisableCompression = true
	// Big reads off the socket: the image is one long stream.
	tr.ReadBufferSize = 256 << 10
	return tr
}

// checkMagic refuses a stream whose first bytes contradict its declared format: a
// compressed image written raw would verify (the digest is of the served bytes) and
// leave a disk of noise.
func checkMagic(format string, head []byte) error {
	got := sniffFormat(head)
	if got == format {
		return nil
	}
	if format == protocol.FormatRaw {
		return fmt.Errorf("declared raw, but the stream starts like %s", got)
	}
	if got == protocol.FormatRaw {
		return fmt.Errorf("declared %s, but the stream does not start with its magic bytes", format)
	}
	return fmt.Errorf("declared %s, but the stream starts like %s", format, got)
}
