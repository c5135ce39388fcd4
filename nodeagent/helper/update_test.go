package helper

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

const (
	testRunning = "0.1.0"
	testNext    = "0.2.0"
)

// codeRollback is the code a release below the floor is refused with (pki's
// ErrReleaseRollback, which selfupdate passes on as the Refusal's code).
var codeRollback = pki.ErrReleaseRollback.Error()

// updateFixture is an UpdateClient on a stand-in helper, whose local Manager
// downloads from a loopback https server.
type updateFixture struct {
	s       *standIn
	u       *UpdateClient
	dataDir string
	binary  []byte
	url     string
}

func newUpdateFixture(t *testing.T) *updateFixture {
	t.Helper()
	f := &updateFixture{s: newStandIn(t, nil), binary: []byte("#!/bin/sh\necho a release\n")}
	dl := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(f.binary) }))
	t.Cleanup(dl.Close)
	f.url = dl.URL + "/bcd_" + testNext + "_linux_amd64"
	dir := t.TempDir()
	f.dataDir = filepath.Join(dir, "data")
	os.Mkdir(f.dataDir, 0o700)
	m, err := selfupdate.New(selfupdate.Options{
		SlotsDir: filepath.Join(dir, "root-slots"), RecordsDir: filepath.Join(dir, "root-slots"),
		DataDir: f.dataDir, Entrypoint: filepath.Join(dir, "bcd"),
		Running: testRunning, HTTPClient: dl.Client(),
	})
	if err != nil {
		t.Fatal(err)
	}
	f.u = NewUpdateClient(f.s.client(), testRunning, m)
	return f
}

func (f *updateFixture) plan() *selfupdate.Plan {
	sum := sha256.Sum256(f.binary)
	return &selfupdate.Plan{Version: testNext, Sequence: 7, Staged: selfupdate.StagedName(testNext),
		Size: int64(len(f.binary)), SHA256: hex.EncodeToString(sum[:]), URL: f.url}
}

func decodeUpdate(t *testing.T, body []byte) UpdateRequest {
	t.Helper()
	var r UpdateRequest
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("update request %s: %v", body, err)
	}
	return r
}

// TestUpdateClientPrepareAndSwap: Prepare asks update.verify with the running
// version, the section and the server time, downloads the verified plan into
// <data_dir>/staging as this process (the helper takes only the node's file),
// and Swap sends update.swap the same section and server time with the
// command and revision.
func TestUpdateClientPrepareAndSwap(t *testing.T) {
	f := newUpdateFixture(t)
	f.s.on(OpUpdateVerify, func([]byte) (int, any) { return http.StatusOK, PlanResponse{Plan: f.plan()} })
	f.s.on(OpUpdateSwap, func([]byte) (int, any) { return http.StatusOK, Empty{} })
	sec := protocol.DaemonSection{Version: testNext, URL: f.url, SHA256: f.plan().SHA256, Signature: `{"manifest":"signed"}`}
	serverNow := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

	p, err := f.u.Prepare(context.Background(), sec, serverNow)
	if err != nil {
		t.Fatal(err)
	}
	if p == nil || p.Version != testNext || p.Section != sec || !p.ServerNow.Equal(serverNow) {
		t.Fatalf("plan %+v, want version %s with the section and server time", p, testNext)
	}
	vs := f.s.requests(OpUpdateVerify)
	if len(vs) != 1 {
		t.Fatalf("%d update.verify requests", len(vs))
	}
	if r := decodeUpdate(t, vs[0]); r.Running != testRunning || r.Section == nil || *r.Section != sec || !r.ServerTime.Equal(serverNow) {
		t.Errorf("update.verify got %+v", r)
	}
	staged := filepath.Join(f.dataDir, selfupdate.StagingDir, selfupdate.StagedName(testNext))
	got, err := os.ReadFile(staged)
	if err != nil || string(got) != string(f.binary) {
		t.Fatalf("staged file %s: %v %q", staged, err, got)
	}
	if fi, _ := os.Stat(staged); fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Geteuid()) {
		t.Errorf("the staged file is not this process's")
	}

	if err := f.u.Swap(context.Background(), p, "cmd_up", 3); err != nil {
		t.Fatal(err)
	}
	ss := f.s.requests(OpUpdateSwap)
	if len(ss) != 1 {
		t.Fatalf("%d update.swap requests", len(ss))
	}
	r := decodeUpdate(t, ss[0])
	if r.Running != testRunning || r.Section == nil || *r.Section != sec || !r.ServerTime.Equal(serverNow) || r.CommandID != "cmd_up" || r.Revision != 3 {
		t.Errorf("update.swap got %+v, want the section verified, its server time, cmd_up and revision 3", r)
	}
	if err := f.u.Swap(context.Background(), nil, "", 0); err == nil {
		t.Error("Swap without a plan succeeded")
	}
}

// TestUpdateClientNothingToDo: a nil plan is nothing to do, and nothing is staged.
func TestUpdateClientNothingToDo(t *testing.T) {
	f := newUpdateFixture(t)
	f.s.on(OpUpdateVerify, func([]byte) (int, any) { return http.StatusOK, PlanResponse{} })
	p, err := f.u.Prepare(context.Background(), protocol.DaemonSection{Version: testRunning}, time.Time{})
	if p != nil || err != nil {
		t.Fatalf("Prepare of the running version = %+v, %v", p, err)
	}
	if _, err := os.Stat(filepath.Join(f.dataDir, selfupdate.StagingDir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("staging exists after nothing to do: %v", err)
	}
}

// TestUpdateClientRefusals: the helper's refusal comes back as a
// *selfupdate.Refusal with its code (daemonupdate reports it ReleaseRefused),
// a host failure as a plain error, and a download that does not match the
// verified plan as the local Manager's refusal, leaving nothing staged.
func TestUpdateClientRefusals(t *testing.T) {
	f := newUpdateFixture(t)
	f.s.on(OpUpdateVerify, func([]byte) (int, any) {
		return http.StatusUnprocessableEntity, Error{Code: codeRollback, Message: "sequence 1 is below the release floor 7", Refusal: true}
	})
	_, err := f.u.Prepare(context.Background(), protocol.DaemonSection{Version: testNext}, time.Time{})
	r, ok := selfupdate.IsRefusal(err)
	if !ok || r.Code != codeRollback || !strings.Contains(err.Error(), "below the release floor 7") {
		t.Fatalf("a refused release = %v (%T), want a *selfupdate.Refusal %s", err, err, codeRollback)
	}

	f.s.on(OpUpdateSwap, func([]byte) (int, any) {
		return http.StatusInternalServerError, Error{Code: CodeFailed, Message: "write /usr/local/lib/bcd/bcd-b: no space left on device"}
	})
	err = f.u.Swap(context.Background(), f.plan(), "", 1)
	if _, ok := selfupdate.IsRefusal(err); ok || !IsCode(err, CodeFailed) || !strings.Contains(err.Error(), "no space left") {
		t.Errorf("a failed swap = %v, want HELPER_FAILED, not a refusal", err)
	}

	bad := f.plan()
	bad.SHA256 = strings.Repeat("0", 64)
	f.s.on(OpUpdateVerify, func([]byte) (int, any) { return http.StatusOK, PlanResponse{Plan: bad} })
	_, err = f.u.Prepare(context.Background(), protocol.DaemonSection{Version: testNext}, time.Time{})
	if r, ok := selfupdate.IsRefusal(err); !ok || r.Code != selfupdate.CodeDigestMismatch {
		t.Errorf("a download that does not match the plan = %v, want %s", err, selfupdate.CodeDigestMismatch)
	}
	if _, err := os.Stat(filepath.Join(f.dataDir, selfupdate.StagingDir, selfupdate.StagedName(testNext))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused download was staged: %v", err)
	}
}

// TestUpdateClientResumeConfirmSwapBack: each sends the running version, and
// the outcome comes back as the helper's Manager returned it.
func TestUpdateClientResumeConfirmSwapBack(t *testing.T) {
	f := newUpdateFixture(t)
	deadline := time.Date(2026, 12, 1, 12, 2, 0, 0, time.UTC)
	f.s.on(OpUpdateResume, func([]byte) (int, any) {
		return http.StatusOK, OutcomeResponse{Outcome: selfupdate.Outcome{State: selfupdate.Pending, Version: testRunning, CommandID: "cmd_up", Deadline: deadline}}
	})
	f.s.on(OpUpdateConfirm, func([]byte) (int, any) {
		return http.StatusOK, OutcomeResponse{Outcome: selfupdate.Outcome{State: selfupdate.Confirmed, Version: testRunning, Revision: 4}}
	})
	f.s.on(OpUpdateSwapBack, func([]byte) (int, any) { return http.StatusOK, Empty{} })
	out, err := f.u.Resume()
	if err != nil || out.State != selfupdate.Pending || out.CommandID != "cmd_up" || !out.Deadline.Equal(deadline) {
		t.Errorf("Resume = %+v, %v", out, err)
	}
	out, err = f.u.Confirm()
	if err != nil || out.State != selfupdate.Confirmed || out.Revision != 4 {
		t.Errorf("Confirm = %+v, %v", out, err)
	}
	if err := f.u.SwapBack("no Welcome by its deadline"); err != nil {
		t.Error(err)
	}
	for _, op := range []string{OpUpdateResume, OpUpdateConfirm, OpUpdateSwapBack} {
		rs := f.s.requests(op)
		if len(rs) != 1 {
			t.Fatalf("%s: %d requests", op, len(rs))
		}
		if r := decodeUpdate(t, rs[0]); r.Running != testRunning {
			t.Errorf("%s sent running %q, want %s", op, r.Running, testRunning)
		}
	}
	if r := decodeUpdate(t, f.s.requests(OpUpdateSwapBack)[0]); r.Why != "no Welcome by its deadline" {
		t.Errorf("update.swap-back's why = %q", r.Why)
	}
}
