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
	srks   map[tpm2.TPMHandle]*tpm2.CreatePrimaryResponse // by hierarchy, loaded on first use
	closed bool
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
	return &TPM{t: t, srks: make(map[tpm2.TPMHandle]*tpm2.CreatePrimaryResponse)}
}

// Close flushes what the TPM holds for it and closes it. Keys made from it stop
// working.
func (t *TPM) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	var errs []error
	for _, srk := range t.srks {
		if _, err := (tpm2.FlushContext{FlushHandle: srk.ObjectHandle}).Execute(t.t); err != nil {
			errs = append(errs, fmt.Errorf("tpm: flushing a primary key: %w", err))
		}
	}
	if err := t.t.Close(); err != nil {
		errs = append(errs, fmt.Errorf("tpm: closing: %w", err))
	}
	return errors.Join(errs...)
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

// srk returns the storage primary key of hierarchy h (TPMRHOwner or
// TPMRHEndorsement), derived from the hierarchy's seed with the TCG ECC P-256 SRK
// template, so that it is the same key after every reboot. Call with t.mu held.
func (t *TPM) srk(h tpm2.TPMHandle) (*tpm2.CreatePrimaryResponse, error) {
	if srk := t.srks[h]; srk != nil {
		return srk, nil
	}
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.AuthHandle{Handle: h, Auth: tpm2.PasswordAuth(nil)},
		InPublic:      tpm2.New2B(tpm2.ECCSRKTemplate),
	}.Execute(t.t)
	if err != nil {
		return nil, err
	}
	t.srks[h] = rsp
	return rsp, nil
}

// load loads the child object (pub, priv) under the SRK of hierarchy h; the caller
// flushes it. Call with t.mu held.
func (t *TPM) load(h tpm2.TPMHandle, pub tpm2.TPM2BPublic, priv tpm2.TPM2BPrivate) (*tpm2.LoadResponse, error) {
	srk, err := t.srk(h)
	if err != nil {
		return nil, fmt.Errorf("deriving the %s SRK: %w", hierarchyName(h), err)
	}
	rsp, err := tpm2.Load{
		ParentHandle: tpm2.AuthHandle{Handle: srk.ObjectHandle, Name: srk.Name, Auth: tpm2.PasswordAuth(nil)},
		InPrivate:    priv,
		InPublic:     pub,
	}.Execute(t.t)
	if err != nil {
		return nil, fmt.Errorf("TPM2_Load under the %s SRK: %w", hierarchyName(h), err)
	}
	return rsp, nil
}

// create makes a child key from template under the SRK of hierarchy h. Call with
// t.mu held.
func (t *TPM) create(h tpm2.TPMHandle, template tpm2.TPMTPublic) (*tpm2.CreateResponse, error) {
	srk, err := t.srk(h)
	if err != nil {
		return nil, fmt.Errorf("deriving the %s SRK: %w", hierarchyName(h), err)
	}
	rsp, err := tpm2.Create{
		ParentHandle: tpm2.AuthHandle{Handle: srk.ObjectHandle, Name: srk.Name, Auth: tpm2.PasswordAuth(nil)},
		InPublic:     tpm2.New2B(template),
	}.Execute(t.t)
	if err != nil {
		return nil, fmt.Errorf("TPM2_Create under the %s SRK: %w", hierarchyName(h), err)
	}
	return rsp, nil
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
