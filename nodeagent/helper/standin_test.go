package helper

import (
	"crypto"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/bcd/agent/tpm"
)

// standIn stands in for bcd helper: an HTTP/1.1 server on a unix socket
// that implements only the wire contract (POST /v1/<op>, JSON, errors as
// {"code","message","refusal"}) and records every request, so the node's
// adapters are tested for exactly what they send, and against answers the
// real Server never gives (a signature by another key, any refusal code).
// *_server_test.go runs the same adapters against the real Server. Its tpm.*
// operations use a real TPM (swtpm) when tpm is set; answer, when set for an
// op, replaces the operation.
type standIn struct {
	t      *testing.T
	socket string
	tpm    *tpm.TPM

	mu     sync.Mutex
	calls  []call
	answer map[string]func(body []byte) (int, any)
}

type call struct {
	op   string
	body []byte
}

func newStandIn(t *testing.T, tp *tpm.TPM) *standIn {
	t.Helper()
	s := &standIn{t: t, socket: filepath.Join(t.TempDir(), "helper.sock"), tpm: tp, answer: map[string]func([]byte) (int, any){}}
	ln, err := net.Listen("unix", s.socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(s.serve)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}

func (s *standIn) client() *Client { return NewClientAt(s.socket) }

// on replaces op's answer.
func (s *standIn) on(op string, f func(body []byte) (int, any)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.answer[op] = f
}

// requests are the bodies op received, in order.
func (s *standIn) requests(op string) [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]byte
	for _, c := range s.calls {
		if c.op == op {
			out = append(out, c.body)
		}
	}
	return out
}

func (s *standIn) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

func (s *standIn) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxRequest))
	if err != nil {
		s.t.Errorf("%s: reading the request: %v", r.URL.Path, err)
	}
	op := strings.TrimPrefix(r.URL.Path, PathPrefix)
	if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
		s.t.Errorf("%s %s with Content-Type %q: the contract is POST with JSON", r.Method, r.URL.Path, r.Header.Get("Content-Type"))
	}
	s.mu.Lock()
	s.calls = append(s.calls, call{op, body})
	f := s.answer[op]
	s.mu.Unlock()
	status, v := http.StatusOK, any(nil)
	if f != nil {
		status, v = f(body)
	} else {
		status, v = s.tpmOp(op, body)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// tpmOp is the default for tpm.*: the real TPM, as bcd helper does it.
func (s *standIn) tpmOp(op string, body []byte) (int, any) {
	fail := func(code string, err error) (int, any) {
		return http.StatusInternalServerError, Error{Code: code, Message: err.Error()}
	}
	if s.tpm == nil {
		if strings.HasPrefix(op, "tpm.") {
			return http.StatusServiceUnavailable, Error{Code: CodeNoTPM, Message: "no TPM in this stand-in"}
		}
		return http.StatusNotFound, Error{Code: CodeUnknownOp, Message: op + " is not in this stand-in"}
	}
	switch op {
	case OpTPMCreate:
		k, rec, err := s.tpm.CreateNodeKey()
		if err != nil {
			return fail(CodeFailed, err)
		}
		der, _ := x509.MarshalPKIXPublicKey(k.Public())
		return http.StatusOK, TPMKeyResponse{Record: rec, PublicKey: der}
	case OpTPMLoad:
		var req TPMKeyRequest
		json.Unmarshal(body, &req)
		k, err := s.tpm.LoadNodeKey(req.Record)
		if err != nil {
			return fail(CodeFailed, err)
		}
		der, _ := x509.MarshalPKIXPublicKey(k.Public())
		return http.StatusOK, TPMKeyResponse{PublicKey: der}
	case OpTPMSign:
		var req TPMSignRequest
		json.Unmarshal(body, &req)
		if req.Hash != crypto.SHA256.String() {
			return http.StatusBadRequest, Error{Code: CodeInvalidRequest, Message: "hash " + req.Hash}
		}
		k, err := s.tpm.LoadNodeKey(req.Record)
		if err != nil {
			return fail(CodeFailed, err)
		}
		sig, err := k.Sign(nil, req.Digest, crypto.SHA256)
		if err != nil {
			return fail(CodeFailed, err)
		}
		return http.StatusOK, TPMSignResponse{Signature: sig}
	}
	return http.StatusNotFound, Error{Code: CodeUnknownOp, Message: op + " is not in this stand-in"}
}
