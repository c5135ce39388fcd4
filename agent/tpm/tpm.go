package tpm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// DefaultPath is the kernel's TPM resource manager, which lets several processes
// share the TPM and flushes what a closed file left loaded.
const DefaultPath = "/dev/tpmrm0"

// maxResponse bounds a response read from a TCP TPM.
const maxResponse = 1 << 20

// TPM is an open TPM 2.0. Its methods, and those of the keys made from it, are safe
// for concurrent use: one command is in flight at a time.
type TPM struct {
	mu     sync.Mutex
	t      transport.TPMCloser
	closed bool

	// primaries holds the saved contexts of the primary keys derived so far, so
	// that they need not be derived again for every signature; a TPM holds only a
	// few objects at once (three, without a resource manager), so none stays
	// loaded between operations.
	primaries map[string]*primary
}

// Open opens the TPM at path, a character device such as DefaultPath.
func Open(path string) (*TPM, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("tpm: opening %s: %w", path, err)
	}
	if fi.Mode()&os.ModeCharDevice == 0 {
		return nil, fmt.Errorf("tpm: opening %s: not a character device", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("tpm: opening %s: %w", path, err)
	}
	return newTPM(transport.FromReadWriteCloser(f)), nil
}

// OpenTCP opens the TPM command port of swtpm (`swtpm socket --server
// type=tcp,port=…`), which takes raw TPM commands. The TPM must already be started
// (swtpm's --flags startup-clear, or its control port).
func OpenTCP(addr string) (*TPM, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("tpm: connecting to %s: %w", addr, err)
	}
	return newTPM(&tcpTPM{c: c}), nil
}

func newTPM(t transport.TPMCloser) *TPM {
	return &TPM{t: t, primaries: make(map[string]*primary)}
}

// Close closes the TPM; nothing of it stays loaded between operations. Keys made from it stop
// working.
func (t *TPM) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	if err := t.t.Close(); err != nil {
		return fmt.Errorf("tpm: closing: %w", err)
	}
	return nil
}

// lock takes the TPM for one operation; it fails once the TPM is closed.
func (t *TPM) lock() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errors.New("tpm: the TPM is closed")
	}
	return nil
}

// primary is a primary key the TPM derived, as a saved context.
type primary struct {
	ctx    tpm2.TPMSContext
	name   tpm2.TPM2BName
	public tpm2.TPM2BPublic
}

// loadPrimary loads the primary key of hierarchy h with template, from its saved
// context when it has one that the TPM still takes (not after a TPM reset), else by
// deriving it with TPM2_CreatePrimary. The caller flushes the handle. Call with t.mu
// held.
func (t *TPM) loadPrimary(id string, h tpm2.TPMHandle, template tpm2.TPMTPublic) (tpm2.TPMHandle, *primary, error) {
	if p := t.primaries[id]; p != nil {
		if rsp, err := (tpm2.ContextLoad{Context: p.ctx}).Execute(t.t); err == nil {
			return rsp.LoadedHandle, p, nil
		}
		delete(t.primaries, id)
	}
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: h, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(template),
	}.Execute(t.t)
	if err != nil {
		return 0, nil, fmt.Errorf("TPM2_CreatePrimary: %w", err)
	}
	p := &primary{name: rsp.Name, public: rsp.OutPublic}
	if s, err := (tpm2.ContextSave{SaveHandle: rsp.ObjectHandle}).Execute(t.t); err == nil {
		p.ctx = s.Context
		t.primaries[id] = p
	}
	return rsp.ObjectHandle, p, nil
}

// withSRK runs f with the storage primary key of hierarchy h (TPMRHOwner or
// TPMRHEndorsement) loaded: the key derived from the hierarchy's seed with the TCG
// ECC P-256 SRK template, the same key after every reboot. Call with t.mu held.
func (t *TPM) withSRK(h tpm2.TPMHandle, f func(srk tpm2.AuthHandle) error) error {
	handle, p, err := t.loadPrimary(hierarchyName(h)+"/srk", h, tpm2.ECCSRKTemplate)
	if err != nil {
		return fmt.Errorf("deriving the %s SRK: %w", hierarchyName(h), err)
	}
	defer t.flush(handle)
	return f(tpm2.AuthHandle{Handle: handle, Name: p.name, Auth: tpm2.PasswordAuth(nil)})
}

// load loads the child object (pub, priv) under the SRK of hierarchy h; the caller
// flushes it. Call with t.mu held.
func (t *TPM) load(h tpm2.TPMHandle, pub tpm2.TPM2BPublic, priv tpm2.TPM2BPrivate) (*tpm2.LoadResponse, error) {
	var rsp *tpm2.LoadResponse
	err := t.withSRK(h, func(srk tpm2.AuthHandle) error {
		var err error
		rsp, err = tpm2.Load{ParentHandle: srk, InPrivate: priv, InPublic: pub}.Execute(t.t)
		if err != nil {
			return fmt.Errorf("TPM2_Load under the %s SRK: %w", hierarchyName(h), err)
		}
		return nil
	})
	return rsp, err
}

// create makes a child key from template under the SRK of hierarchy h. Call with
// t.mu held.
func (t *TPM) create(h tpm2.TPMHandle, template tpm2.TPMTPublic) (*tpm2.CreateResponse, error) {
	var rsp *tpm2.CreateResponse
	err := t.withSRK(h, func(srk tpm2.AuthHandle) error {
		var err error
		rsp, err = tpm2.Create{ParentHandle: srk, InPublic: tpm2.New2B(template)}.Execute(t.t)
		if err != nil {
			return fmt.Errorf("TPM2_Create under the %s SRK: %w", hierarchyName(h), err)
		}
		return nil
	})
	return rsp, err
}

func (t *TPM) flush(h tpm2.TPMHandle) {
	// A failed flush leaves a transient object that the resource manager drops
	// when the TPM is closed; there is nothing better to do with the error.
	_, _ = tpm2.FlushContext{FlushHandle: h}.Execute(t.t)
}

func hierarchyName(h tpm2.TPMHandle) string {
	switch h {
	case tpm2.TPMRHOwner:
		return "owner"
	case tpm2.TPMRHEndorsement:
		return "endorsement"
	}
	return fmt.Sprintf("%#x", uint32(h))
}

// tcpTPM sends raw TPM commands over a TCP connection, as swtpm's server port takes
// them: a command, then a response whose header carries its size.
type tcpTPM struct {
	c net.Conn
}

func (t *tcpTPM) Send(cmd []byte) ([]byte, error) {
	if _, err := t.c.Write(cmd); err != nil {
		return nil, fmt.Errorf("sending a command: %w", err)
	}
	hdr := make([]byte, 10) // tag, responseSize, responseCode
	if _, err := io.ReadFull(t.c, hdr); err != nil {
		return nil, fmt.Errorf("reading a response: %w", err)
	}
	size := binary.BigEndian.Uint32(hdr[2:6])
	if size < 10 || size > maxResponse {
		return nil, fmt.Errorf("reading a response: a size of %d bytes", size)
	}
	rsp := make([]byte, size)
	copy(rsp, hdr)
	if _, err := io.ReadFull(t.c, rsp[10:]); err != nil {
		return nil, fmt.Errorf("reading a response: %w", err)
	}
	return rsp, nil
}

func (t *tcpTPM) Close() error { return t.c.Close() }
