package helper

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/internal/syncbuf"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/daemonupdate/updatetest"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/protocol"
)

// wait is how long a test waits for an event: a loaded 2-core machine.
const wait = 30 * time.Second

// newServer is the helper for tr in this process. The test binary is the
// helper's own binary, so the test (root) is served.
func newServer(t *testing.T, tr *tree) (*Server, *syncbuf.Buffer) {
	t.Helper()
	log, buf := logBuffer()
	s, err := NewServer(tr.load(), tr.config, log)
	if err != nil {
		t.Fatal(err)
	}
	s.Reboot = func() error { return errors.New("the test did not expect a reboot") }
	s.RestartNode = func(context.Context) error { return errors.New("the test did not expect a restart") }
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the helper's log:\n%s", buf.String())
		}
	})
	return s, buf
}

func client(tr *tree) *Client { return NewClientAt(tr.socket) }

// raw posts body to path on the socket and returns the status and Error.
func raw(t *testing.T, tr *tree, method, path string, body []byte) (int, Error) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", tr.socket)
	}}}
	req, err := http.NewRequest(method, "http://bcd-helper"+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	var e Error
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatalf("%s %s: %d %q is not an Error: %v", method, path, res.StatusCode, data, err)
	}
	return res.StatusCode, e
}

func wantError(t *testing.T, err error, code, says string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, says) {
		t.Errorf("got %v; want %s saying %q", err, code, says)
	}
}

func TestRequests(t *testing.T) {
	tr := newTree(t)
	s, _ := newServer(t, tr)
	served(t, s)
	ctx := context.Background()
	c := client(tr)

	wantError(t, c.Call(ctx, "shell.run", Empty{}, nil), CodeUnknownOp, `no operation "/v1/shell.run"`)
	wantError(t, c.Call(ctx, OpReboot, map[string]int{"delay": 1}, nil), CodeInvalidRequest, `reboot: the request does not decode: json: unknown field "delay"`)
	wantError(t, c.Call(ctx, OpUpdateResume, UpdateRequest{Running: "0.1.0; rm -rf /"}, nil), CodeInvalidRequest, `update.resume: running: selfupdate: the running version "0.1.0; rm -rf /" is not a version`)
	wantError(t, c.Call(ctx, OpUpdateVerify, UpdateRequest{Running: "0.1.0"}, nil), CodeInvalidRequest, "update.verify: the request has no section")
	wantError(t, c.Call(ctx, OpUpdateConfirm, UpdateRequest{Running: "0.1.0", Section: &protocol.DaemonSection{}}, nil), CodeInvalidRequest, "update.confirm: the request carries a section")
	wantError(t, c.Call(ctx, OpUpdateSwapBack, UpdateRequest{Running: "0.1.0"}, nil), CodeInvalidRequest, "update.swap-back: the request has no why")
	for _, tc := range []struct {
		name, method, path string
		body               []byte
		status             int
		code, says         string
	}{
		{"bad JSON", http.MethodPost, "/v1/reboot", []byte("{"), 400, CodeInvalidRequest, "reboot: the request does not decode: unexpected EOF"},
		{"data after the object", http.MethodPost, "/v1/reboot", []byte("{} {}"), 400, CodeInvalidRequest, "data after the JSON object"},
		{"too large", http.MethodPost, "/v1/tpm.load", append(append([]byte(`{"record":"`), bytes.Repeat([]byte("A"), MaxRequest)...), '"', '}'), 400, CodeInvalidRequest, fmt.Sprintf("larger than %d bytes", MaxRequest)},
		{"GET", http.MethodGet, "/v1/reboot", nil, 405, CodeInvalidRequest, "GET /v1/reboot: only POST"},
		{"outside /v1/", http.MethodPost, "/reboot", []byte("{}"), 404, CodeUnknownOp, `no operation "/reboot"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, e := raw(t, tr, tc.method, tc.path, tc.body)
			if status != tc.status || e.Code != tc.code || !strings.Contains(e.Message, tc.says) {
				t.Errorf("%d %+v; want %d %s saying %q", status, e, tc.status, tc.code, tc.says)
			}
		})
	}
}

func TestReboot(t *testing.T) {
	tr := newTree(t)
	s, _ := newServer(t, tr)
	rebooted := make(chan struct{}, 1)
	s.Reboot = func() error { rebooted <- struct{}{}; return nil }
	s.RebootAfter = 0
	ready := errors.New("the machine cannot reboot now")
	s.RebootReady = func() error { return ready }
	served(t, s)
	ctx := context.Background()

	wantError(t, client(tr).Reboot(ctx), CodeFailed, "reboot: the machine cannot reboot now")
	ready = nil
	if err := client(tr).Reboot(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rebooted:
	case <-time.After(wait):
		t.Fatal("the Rebooter was not called")
	}
}

// release is a signed test release and the tree whose [update] pins its key.
type release struct {
	*updatetest.Releaser
	tr *tree
}

func newRelease(t *testing.T) *release {
	tr := newTree(t)
	r := updatetest.New(t, updatetest.TLSServer)
	tr.update = fmt.Sprintf("release_pins = %q\nrelease_sequence = 1\n", r.Pin)
	tr.writeConfig()
	// The install script's binary at the entrypoint, root's and 0755.
	if err := os.WriteFile(tr.entry, []byte("#!/bin/sh\necho bcd 0.1.0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &release{r, tr}
}

func body(version string) []byte {
	return []byte("#!/bin/sh\necho bcd " + version + "\n" + strings.Repeat("#", 100) + "\n")
}

// stage puts version's binary where the node's download leaves it, owned by
// uid.
func (r *release) stage(t *testing.T, version string, uid int) {
	t.Helper()
	dir := filepath.Join(r.tr.data, selfupdate.StagingDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, nodeUID, nodeGID); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, selfupdate.StagedName(version))
	if err := os.WriteFile(f, body(version), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f, uid, uid); err != nil {
		t.Fatal(err)
	}
}

func status(t *testing.T, s *Server) selfupdate.Status {
	t.Helper()
	st, err := s.Update.Status()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestUpdateThroughTheHelper(t *testing.T) {
	r := newRelease(t)
	s, _ := newServer(t, r.tr)
	run := served(t, s)
	ctx := context.Background()
	c := client(r.tr)
	sec := r.Section(t, "0.2.0", 2, body("0.2.0"))

	if out, err := c.UpdateResume(ctx, "0.1.0"); err != nil || out.State != selfupdate.None {
		t.Fatalf("resume: %+v, %v", out, err)
	}
	plan, err := c.UpdateVerify(ctx, "0.1.0", sec, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if plan == nil || plan.Version != "0.2.0" || plan.Sequence != 2 || plan.Staged != "bcd-0.2.0" || plan.URL != sec.URL {
		t.Fatalf("plan %+v", plan)
	}
	// A section the helper's pins did not sign is refused at verify and at
	// swap: the helper never takes the node's word for a release.
	other := updatetest.New(t, updatetest.TLSServer).Section(t, "0.2.0", 2, body("0.2.0"))
	for _, err := range []error{
		func() error { _, err := c.UpdateVerify(ctx, "0.1.0", other, time.Time{}); return err }(),
		c.UpdateSwap(ctx, "0.1.0", other, time.Time{}, "cmd-1", 7),
	} {
		if ref, ok := selfupdate.IsRefusal(err); !ok || !strings.HasPrefix(ref.Code, "RELEASE_") {
			t.Errorf("a section signed by an unpinned key: %v; want a RELEASE_* refusal", err)
		}
	}

	// A staged file root owns, not the node, is refused.
	r.stage(t, "0.2.0", 0)
	err = c.UpdateSwap(ctx, "0.1.0", sec, time.Time{}, "cmd-1", 7)
	staged := filepath.Join(r.tr.data, "staging/bcd-0.2.0")
	if ref, ok := selfupdate.IsRefusal(err); !ok || ref.Code != selfupdate.CodeStagingRefused ||
		ref.Message != "the staged file "+staged+" is owned by uid 0, not the node's uid 65534" {
		t.Fatalf("a root-owned staged file: %v", err)
	}
	if st := status(t, s); st.Pending != nil || st.Current == "b" {
		t.Fatalf("swapped after a refusal: %+v", st)
	}

	r.stage(t, "0.2.0", nodeUID)
	if err := c.UpdateSwap(ctx, "0.1.0", sec, time.Time{}, "cmd-1", 7); err != nil {
		t.Fatal(err)
	}
	st := status(t, s)
	if st.Pending == nil || st.Pending.Version != "0.2.0" || st.Pending.CommandID != "cmd-1" || st.Current != "b" || !st.EntrypointLinked {
		t.Fatalf("after the swap: %+v", st)
	}
	if got, err := os.ReadFile(filepath.Join(r.tr.slots, "bcd-b")); err != nil || !bytes.Equal(got, body("0.2.0")) {
		t.Fatalf("bcd-b: %q, %v", got, err)
	}
	s.mu.Lock()
	armed := s.watchdog != nil
	s.mu.Unlock()
	if !armed {
		t.Error("the watchdog is not armed after the swap")
	}
	// Only the new binary confirms itself.
	wantError(t, func() error { _, err := c.UpdateConfirm(ctx, "0.1.0"); return err }(), CodeFailed,
		"update.confirm: selfupdate: cannot confirm bcd 0.2.0 from bcd 0.1.0: only the new binary confirms itself")
	out, err := c.UpdateConfirm(ctx, "0.2.0")
	if err != nil || out.State != selfupdate.Confirmed || out.Version != "0.2.0" {
		t.Fatalf("confirm: %+v, %v", out, err)
	}
	if st := status(t, s); st.Pending != nil || st.Floor != 2 {
		t.Errorf("after the confirm: %+v", st)
	}
	s.mu.Lock()
	armed = s.watchdog != nil
	s.mu.Unlock()
	if armed {
		t.Error("the watchdog is still armed after the confirm")
	}
	// The helper still runs its old binary: it stops serving to re-exec.
	select {
	case <-run.done:
		if !errors.Is(run.err, ErrReExec) {
			t.Errorf("Run returned %v, want ErrReExec", run.err)
		}
	case <-time.After(wait):
		t.Fatal("Run did not return for the re-exec after a confirmed update")
	}
	if _, err := os.Lstat(r.tr.socket); !os.IsNotExist(err) {
		t.Errorf("the socket is still there for the re-exec: %v", err)
	}
}

func TestUpdateSwapBack(t *testing.T) {
	r := newRelease(t)
	s, _ := newServer(t, r.tr)
	served(t, s)
	ctx := context.Background()
	c := client(r.tr)
	sec := r.Section(t, "0.2.0", 2, body("0.2.0"))
	r.stage(t, "0.2.0", nodeUID)
	if err := c.UpdateSwap(ctx, "0.1.0", sec, time.Time{}, "cmd-1", 7); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateSwapBack(ctx, "0.2.0", "no Welcome by the deadline"); err != nil {
		t.Fatal(err)
	}
	st := status(t, s)
	if st.Current != "a" || st.Pending == nil || st.Pending.SwappedBack == nil || st.Pending.SwappedBack.Why != "no Welcome by the deadline" {
		t.Fatalf("after the swap back: %+v", st)
	}
	// The old binary records the failure.
	out, err := c.UpdateResume(ctx, "0.1.0")
	if err != nil || out.State != selfupdate.Failed || out.Message != "bcd 0.2.0 did not start: no Welcome by the deadline" {
		t.Fatalf("resume after the swap back: %+v, %v", out, err)
	}
	if err := c.UpdateSwapBack(ctx, "0.1.0", "again"); err == nil || !strings.Contains(err.Error(), "no update awaits its Welcome") {
		t.Errorf("a second swap back: %v", err)
	}
}

// shortDeadline gives s a Manager whose swaps have deadline d.
func shortDeadline(t *testing.T, s *Server, d time.Duration) {
	t.Helper()
	o := s.Update.Options()
	o.Deadline = d
	m, err := selfupdate.New(o)
	if err != nil {
		t.Fatal(err)
	}
	s.Update = m
}

func TestWatchdog(t *testing.T) {
	type events struct {
		fired     chan bool
		restarted chan struct{}
	}
	hook := func(s *Server, grace time.Duration) events {
		e := events{make(chan bool, 4), make(chan struct{}, 4)}
		s.Grace = grace
		s.onFired = func(b bool) { e.fired <- b }
		s.RestartNode = func(context.Context) error { e.restarted <- struct{}{}; return nil }
		return e
	}
	swap := func(t *testing.T, r *release, s *Server) {
		t.Helper()
		r.stage(t, "0.2.0", nodeUID)
		if err := client(r.tr).UpdateSwap(context.Background(), "0.1.0", r.Section(t, "0.2.0", 2, body("0.2.0")), time.Time{}, "cmd-1", 7); err != nil {
			t.Fatal(err)
		}
	}
	firing := func(t *testing.T, e events) bool {
		t.Helper()
		select {
		case b := <-e.fired:
			return b
		case <-time.After(wait):
			t.Fatal("the watchdog did not fire")
		}
		return false
	}

	t.Run("swaps back and restarts the node after the deadline and the grace", func(t *testing.T) {
		r := newRelease(t)
		s, buf := newServer(t, r.tr)
		shortDeadline(t, s, time.Second)
		e := hook(s, 200*time.Millisecond)
		served(t, s)
		swap(t, r, s)
		if !firing(t, e) {
			t.Fatal("the watchdog fired but did not swap back")
		}
		select {
		case <-e.restarted:
		case <-time.After(wait):
			t.Fatal("the watchdog did not restart the node")
		}
		st := status(t, s)
		if st.Current != "a" || st.Pending == nil || st.Pending.SwappedBack == nil || st.Pending.SwappedBack.Why != WatchdogWhy {
			t.Fatalf("after the watchdog: %+v", st)
		}
		if st.Pending.SwappedBack.At.Before(st.Pending.Deadline.Add(200 * time.Millisecond)) {
			t.Errorf("swapped back at %v, before the deadline %v plus the grace", st.Pending.SwappedBack.At, st.Pending.Deadline)
		}
		for _, says := range []string{"the watchdog is armed", "still unconfirmed after its deadline; swapping back", "restarted bcd.service"} {
			if !strings.Contains(buf.String(), says) {
				t.Errorf("the log does not say %q", says)
			}
		}
	})

	t.Run("arms at start for an update pending from before", func(t *testing.T) {
		r := newRelease(t)
		first, _ := newServer(t, r.tr)
		shortDeadline(t, first, time.Second)
		hook(first, time.Hour)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- first.Run(ctx) }()
		deadline := time.Now().Add(wait)
		for {
			if _, err := os.Lstat(r.tr.socket); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the first helper did not serve")
			}
			time.Sleep(10 * time.Millisecond)
		}
		swap(t, r, first)
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		s, _ := newServer(t, r.tr)
		e := hook(s, 100*time.Millisecond)
		served(t, s)
		if !firing(t, e) {
			t.Fatal("the watchdog fired but did not swap back")
		}
		<-e.restarted
		if st := status(t, s); st.Pending == nil || st.Pending.SwappedBack == nil || st.Pending.SwappedBack.Why != WatchdogWhy {
			t.Fatalf("after the watchdog: %+v", st)
		}
	})

	t.Run("does nothing once the update confirmed", func(t *testing.T) {
		r := newRelease(t)
		s, _ := newServer(t, r.tr)
		shortDeadline(t, s, time.Second)
		e := hook(s, 100*time.Millisecond)
		served(t, s)
		swap(t, r, s)
		// Confirmed behind the watchdog's back: the timer stays armed and
		// must find nothing to do when it fires.
		m, err := s.Update.ForRunning("0.2.0")
		if err != nil {
			t.Fatal(err)
		}
		if out, err := m.Confirm(); err != nil || out.State != selfupdate.Confirmed {
			t.Fatalf("confirm: %+v, %v", out, err)
		}
		if firing(t, e) {
			t.Fatal("the watchdog swapped back a confirmed update")
		}
		select {
		case <-e.restarted:
			t.Fatal("the watchdog restarted the node after a confirm")
		default:
		}
		if st := status(t, s); st.Pending != nil || st.Current != "b" {
			t.Fatalf("after the watchdog: %+v", st)
		}
	})
}

func TestTPMOperations(t *testing.T) {
	tr := newTree(t)
	s, _ := newServer(t, tr)
	withSWTPM(t, s)
	served(t, s)
	ctx := context.Background()
	c := client(tr)

	made, err := c.TPMCreate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !tpm.IsRecord(made.Record) {
		t.Fatalf("tpm.create's record is not a node key's record: %q", made.Record)
	}
	pub, err := c.TPMLoad(ctx, made.Record)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pub, made.PublicKey) {
		t.Error("tpm.load's public key is not tpm.create's")
	}
	key, err := x509.ParsePKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte("the CSR"))
	sig, err := c.TPMSign(ctx, made.Record, digest[:], crypto.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(key.(*ecdsa.PublicKey), digest[:], sig) {
		t.Error("the signature does not verify with the key's public key")
	}
	// A fresh helper (no cached key) loads the record into the TPM to sign.
	s.mu.Lock()
	clear(s.keys)
	s.mu.Unlock()
	other := sha256.Sum256([]byte("another"))
	if sig, err := c.TPMSign(ctx, made.Record, other[:], crypto.SHA256); err != nil || !ecdsa.VerifyASN1(key.(*ecdsa.PublicKey), other[:], sig) {
		t.Errorf("signing with a record not cached: %v", err)
	}

	pkcs8 := []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	_, err = c.TPMLoad(ctx, pkcs8)
	wantError(t, err, CodeInvalidRequest, "tpm.load: the record is not a TPM node key's record (BCD TPM NODE KEY)")
	_, err = c.TPMSign(ctx, pkcs8, digest[:], crypto.SHA256)
	wantError(t, err, CodeInvalidRequest, "tpm.sign: the record is not a TPM node key's record")
	_, err = c.TPMSign(ctx, made.Record, digest[:31], crypto.SHA256)
	wantError(t, err, CodeInvalidRequest, "tpm.sign: a SHA-256 digest is 32 bytes, not 31")
	_, err = c.TPMSign(ctx, made.Record, digest[:], crypto.SHA384)
	wantError(t, err, CodeInvalidRequest, "tpm.sign: a SHA-384 digest is 48 bytes, not 32")
	wantError(t, c.Call(ctx, OpTPMSign, TPMSignRequest{Record: made.Record, Digest: digest[:16], Hash: "MD5"}, nil), CodeInvalidRequest,
		`tpm.sign: hash "MD5" is not SHA-256, SHA-384 or SHA-512`)
	// A record whose public area was tampered with is not the TPM's to take.
	block, _ := pem.Decode(made.Record)
	if block == nil {
		t.Fatal("the record is not PEM")
	}
	block.Bytes[len(block.Bytes)-8] ^= 0xff
	bad := pem.EncodeToMemory(block)
	_, err = c.TPMLoad(ctx, bad)
	wantError(t, err, CodeInvalidRequest, "tpm.load: the TPM does not take the record")
}

func TestTPMOperationsWithoutTPM(t *testing.T) {
	tr := newTree(t)
	s, _ := newServer(t, tr)
	missing := filepath.Join(tr.root, "dev/tpmrm0")
	s.Keys = &nodekey.Host{Path: missing, RequireTPM: true, Getenv: func(string) string { return "" }}
	served(t, s)
	_, err := client(tr).TPMCreate(context.Background())
	wantError(t, err, CodeNoTPM, "tpm.create: no TPM: "+missing+" does not exist")
}
