package helper

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"time"

	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/internal/buildmode"
)

// EnvFakeHWRebootFile names the file a fakehw bcd helper appends a line to
// instead of rebooting the machine (bcd helper's command reads it); without
// it a fakehw reboot fails.
const EnvFakeHWRebootFile = "BCD_FAKEHW_HELPER_REBOOT_FILE"

// maxKeys bounds the loaded TPM keys kept: a node has one node key, two
// during a renewal.
const maxKeys = 8

type keyEntry struct{ key *tpm.Key }

// handlers is every operation's handler, by op name.
func (s *Server) handlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		OpReboot:         s.opReboot,
		OpUpdateResume:   s.opUpdateResume,
		OpUpdateVerify:   s.opUpdateVerify,
		OpUpdateSwap:     s.opUpdateSwap,
		OpUpdateConfirm:  s.opUpdateConfirm,
		OpUpdateSwapBack: s.opUpdateSwapBack,
		OpTPMCreate:      s.opTPMCreate,
		OpTPMLoad:        s.opTPMLoad,
		OpTPMSign:        s.opTPMSign,
	}
}

// opReboot answers first, then reboots: the node reads that the helper took
// the reboot before the machine goes down.
func (s *Server) opReboot(w http.ResponseWriter, r *http.Request) {
	var req Empty
	if err := decode(r, &req); err != nil {
		invalid(w, "%s: %v", OpReboot, err)
		return
	}
	if s.Reboot == nil {
		s.fail(w, OpReboot, errors.New("this bcd helper has no way to reboot the machine"))
		return
	}
	if s.RebootReady != nil {
		if err := s.RebootReady(); err != nil {
			s.fail(w, OpReboot, err)
			return
		}
	}
	s.Logger.Warn("bcd helper: rebooting the machine, as the node asked")
	writeJSON(w, Empty{})
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	reboot := s.Reboot
	time.AfterFunc(s.RebootAfter, func() {
		if err := reboot(); err != nil {
			s.Logger.Error("bcd helper: the reboot failed", "err", err.Error())
		}
	})
}

// updateRequest decodes an update.* request and gives the Manager for the
// node's running version.
func (s *Server) updateRequest(w http.ResponseWriter, r *http.Request, op string, needSection bool) (*UpdateRequest, *selfupdate.Manager, bool) {
	var req UpdateRequest
	if err := decode(r, &req); err != nil {
		invalid(w, "%s: %v", op, err)
		return nil, nil, false
	}
	if needSection && req.Section == nil {
		invalid(w, "%s: the request has no section", op)
		return nil, nil, false
	}
	if !needSection && req.Section != nil {
		invalid(w, "%s: the request carries a section; only %s and %s take one", op, OpUpdateVerify, OpUpdateSwap)
		return nil, nil, false
	}
	m, err := s.Update.ForRunning(req.Running)
	if err != nil {
		invalid(w, "%s: running: %v", op, err)
		return nil, nil, false
	}
	return &req, m, true
}

func (s *Server) opUpdateResume(w http.ResponseWriter, r *http.Request) {
	_, m, ok := s.updateRequest(w, r, OpUpdateResume, false)
	if !ok {
		return
	}
	out, err := m.Resume()
	if err != nil {
		s.fail(w, OpUpdateResume, err)
		return
	}
	writeJSON(w, OutcomeResponse{Outcome: out})
}

func (s *Server) opUpdateVerify(w http.ResponseWriter, r *http.Request) {
	req, m, ok := s.updateRequest(w, r, OpUpdateVerify, true)
	if !ok {
		return
	}
	p, err := m.Verify(*req.Section, req.ServerTime)
	if err != nil {
		s.fail(w, OpUpdateVerify, err)
		return
	}
	writeJSON(w, PlanResponse{Plan: p})
}

// opUpdateSwap verifies the section again under the helper's own pins and
// floor (a plan from the node is never trusted), installs the staged file
// the node's uid owns and swaps, then arms the watchdog.
func (s *Server) opUpdateSwap(w http.ResponseWriter, r *http.Request) {
	req, m, ok := s.updateRequest(w, r, OpUpdateSwap, true)
	if !ok {
		return
	}
	p, err := m.Verify(*req.Section, req.ServerTime)
	if err != nil {
		s.fail(w, OpUpdateSwap, err)
		return
	}
	if p == nil {
		invalid(w, "%s: the section names bcd %s, which the node runs: nothing to swap", OpUpdateSwap, req.Running)
		return
	}
	if err := m.Swap(r.Context(), p, req.CommandID, req.Revision); err != nil {
		s.fail(w, OpUpdateSwap, err)
		return
	}
	s.Logger.Info("bcd helper: swapped for the node", "version", p.Version, "command_id", req.CommandID)
	s.armWatchdog()
	writeJSON(w, Empty{})
}

// opUpdateConfirm confirms, and after a confirmed update has the helper
// re-executed once the answer is out: it still runs the old binary.
func (s *Server) opUpdateConfirm(w http.ResponseWriter, r *http.Request) {
	_, m, ok := s.updateRequest(w, r, OpUpdateConfirm, false)
	if !ok {
		return
	}
	out, err := m.Confirm()
	if err != nil {
		s.fail(w, OpUpdateConfirm, err)
		return
	}
	writeJSON(w, OutcomeResponse{Outcome: out})
	if out.State == selfupdate.Confirmed {
		s.stopWatchdog()
		s.requestReExec(out.Version)
	}
}

func (s *Server) opUpdateSwapBack(w http.ResponseWriter, r *http.Request) {
	req, m, ok := s.updateRequest(w, r, OpUpdateSwapBack, false)
	if !ok {
		return
	}
	if req.Why == "" {
		invalid(w, "%s: the request has no why", OpUpdateSwapBack)
		return
	}
	if err := m.SwapBack(req.Why); err != nil {
		s.fail(w, OpUpdateSwapBack, err)
		return
	}
	s.stopWatchdog()
	writeJSON(w, Empty{})
}

// requestReExec asks Run to re-exec the helper when the entrypoint no
// longer runs the helper's own binary.
func (s *Server) requestReExec(version string) {
	if fi, err := os.Stat(s.Update.Options().Entrypoint); err == nil && s.self != nil && os.SameFile(fi, s.self) {
		return
	}
	s.Logger.Info("bcd helper: the node confirmed its update; re-executing the entrypoint once no request is in flight",
		"version", version, "entrypoint", s.Update.Options().Entrypoint)
	s.reOnce.Do(func() { close(s.reexec) })
}

func (s *Server) opTPMCreate(w http.ResponseWriter, r *http.Request) {
	var req Empty
	if err := decode(r, &req); err != nil {
		invalid(w, "%s: %v", OpTPMCreate, err)
		return
	}
	t, ok := s.tpm(w, OpTPMCreate)
	if !ok {
		return
	}
	key, record, err := t.CreateNodeKey()
	if err != nil {
		s.fail(w, OpTPMCreate, err)
		return
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		s.fail(w, OpTPMCreate, err)
		return
	}
	s.keep(record, key)
	s.Logger.Info("bcd helper: made a node key in the TPM", "tpm", s.Keys.Where())
	writeJSON(w, TPMKeyResponse{Record: record, PublicKey: pub})
}

func (s *Server) opTPMLoad(w http.ResponseWriter, r *http.Request) {
	var req TPMKeyRequest
	if err := decode(r, &req); err != nil {
		invalid(w, "%s: %v", OpTPMLoad, err)
		return
	}
	key, ok := s.loadKey(w, OpTPMLoad, req.Record)
	if !ok {
		return
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		s.fail(w, OpTPMLoad, err)
		return
	}
	writeJSON(w, TPMKeyResponse{PublicKey: pub})
}

// signHashes are the hashes tpm.sign takes, by crypto.Hash.String().
var signHashes = map[string]crypto.Hash{
	crypto.SHA256.String(): crypto.SHA256,
	crypto.SHA384.String(): crypto.SHA384,
	crypto.SHA512.String(): crypto.SHA512,
}

func (s *Server) opTPMSign(w http.ResponseWriter, r *http.Request) {
	var req TPMSignRequest
	if err := decode(r, &req); err != nil {
		invalid(w, "%s: %v", OpTPMSign, err)
		return
	}
	h, ok := signHashes[req.Hash]
	if !ok {
		invalid(w, "%s: hash %q is not SHA-256, SHA-384 or SHA-512", OpTPMSign, req.Hash)
		return
	}
	if len(req.Digest) != h.Size() {
		invalid(w, "%s: a %s digest is %d bytes, not %d", OpTPMSign, req.Hash, h.Size(), len(req.Digest))
		return
	}
	key, ok := s.loadKey(w, OpTPMSign, req.Record)
	if !ok {
		return
	}
	sig, err := key.Sign(nil, req.Digest, h)
	if err != nil {
		s.fail(w, OpTPMSign, err)
		return
	}
	writeJSON(w, TPMSignResponse{Signature: sig})
}

// tpm opens the host's TPM; none answers 409 NO_TPM.
func (s *Server) tpm(w http.ResponseWriter, op string) (*tpm.TPM, bool) {
	if s.Keys == nil {
		writeError(w, http.StatusConflict, &Error{Code: CodeNoTPM, Message: op + ": this bcd helper has no TPM"})
		return nil, false
	}
	t, err := s.Keys.TPM()
	if errors.Is(err, nodekey.ErrNoTPM) {
		writeError(w, http.StatusConflict, &Error{Code: CodeNoTPM, Message: fmt.Sprintf("%s: %v", op, err)})
		return nil, false
	}
	if err != nil {
		s.fail(w, op, fmt.Errorf("the TPM (%s): %w", s.Keys.Where(), err))
		return nil, false
	}
	return t, true
}

// loadKey is record's key, from the cache or loaded into the TPM. Only a
// node key's record (under the owner SRK) loads: an AK's or anything else
// is refused.
func (s *Server) loadKey(w http.ResponseWriter, op string, record []byte) (*tpm.Key, bool) {
	if !tpm.IsRecord(record) {
		invalid(w, "%s: the record is not a TPM node key's record (%s)", op, tpm.NodeKeyPEMType)
		return nil, false
	}
	sum := sha256.Sum256(record)
	s.mu.Lock()
	e, hit := s.keys[sum]
	s.mu.Unlock()
	if hit {
		return e.key, true
	}
	t, ok := s.tpm(w, op)
	if !ok {
		return nil, false
	}
	key, err := t.LoadNodeKey(record)
	if err != nil {
		invalid(w, "%s: the TPM does not take the record: %v", op, err)
		return nil, false
	}
	s.keep(record, key)
	return key, true
}

func (s *Server) keep(record []byte, key *tpm.Key) {
	sum := sha256.Sum256(record)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil {
		s.keys = map[[32]byte]keyEntry{}
	}
	if len(s.keys) >= maxKeys {
		for k := range s.keys {
			delete(s.keys, k)
			break
		}
	}
	s.keys[sum] = keyEntry{key}
}

// restartNodeService restarts bcd.service under systemd. Without systemd (or
// in a fakehw build, which never touches the host's units) it fails saying
// the node must be restarted by hand.
func restartNodeService(ctx context.Context) error {
	if _, err := os.Stat("/run/systemd/system"); err != nil || buildmode.FakeHW {
		return errors.New("not under systemd (or a fakehw build): restart bcd node by hand so that it runs the swapped-back binary")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "systemctl", "restart", "bcd.service").CombinedOutput()
	if err != nil {
		return fmt.Errorf("systemctl restart bcd.service: %v: %s", err, out)
	}
	return nil
}
