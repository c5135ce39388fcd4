package selfupdate

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// TestSwapRefusesStaging: the staged file is not what the download left
// there. Each refusal comes quickly (a FIFO must not hang the swap) and
// swaps nothing: current still points at the old slot.
func TestSwapRefusesStaging(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(t *testing.T, staging, staged string)
		code   string
	}{
		{name: "a FIFO", code: CodeStagingRefused, tamper: func(t *testing.T, staging, staged string) {
			must(t, os.Remove(staged))
			must(t, syscall.Mkfifo(staged, 0o600))
		}},
		{name: "a symlinked staging directory", code: CodeStagingRefused, tamper: func(t *testing.T, staging, staged string) {
			must(t, os.Rename(staging, staging+"-elsewhere"))
			must(t, os.Symlink(filepath.Base(staging)+"-elsewhere", staging))
		}},
		{name: "two links", code: CodeStagingRefused, tamper: func(t *testing.T, staging, staged string) {
			must(t, os.Link(staged, filepath.Join(staging, "second-name")))
		}},
		{name: "a symlink", code: CodeStagingRefused, tamper: func(t *testing.T, staging, staged string) {
			must(t, os.Rename(staged, staged+".real"))
			must(t, os.Symlink(filepath.Base(staged)+".real", staged))
		}},
		{name: "gone", code: CodeStagingRefused, tamper: func(t *testing.T, staging, staged string) {
			must(t, os.Remove(staged))
		}},
		{name: "changed bytes", code: CodeDigestMismatch, tamper: func(t *testing.T, staging, staged string) {
			must(t, os.WriteFile(staged, []byte(strings.ToUpper(string(binary("0.2.0")))), 0o600))
		}},
		{name: "grew", code: CodeSizeMismatch, tamper: func(t *testing.T, staging, staged string) {
			must(t, os.WriteFile(staged, append(binary("0.2.0"), 'x'), 0o600))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHost(t)
			m := h.manager("0.1.0")
			p, err := m.Prepare(context.Background(), h.section("0.2.0", 5), testNow)
			must(t, err)
			staging := filepath.Join(h.opts.DataDir, StagingDir)
			tt.tamper(t, staging, filepath.Join(staging, "bcd-0.2.0"))
			done := make(chan error, 1)
			go func() { done <- m.Swap(context.Background(), p, "cmd", 1) }()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the swap hangs on the staged file")
			}
			wantCode(t, err, tt.code)
			t.Log(err)
			// Adoption may have happened (slot a holds the running
			// binary); the swap did not.
			if got := h.link(CurrentLink); got != "bcd-a" {
				t.Errorf("current -> %q, want bcd-a", got)
			}
			if h.exists(filepath.Join(h.slotsDir(), "bcd-b")) {
				t.Error("slot b was written")
			}
			if _, ok := h.upgradeRecord(); ok {
				t.Error("upgrade.json was written")
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestSwapRefusesEntrypoint: adoption takes only a root-owned regular file
// that group and others cannot write, or a link to current.
func TestSwapRefusesEntrypoint(t *testing.T) {
	tests := []struct {
		name      string
		needRoot  bool
		tamper    func(t *testing.T, entry string)
		wantInMsg string
	}{
		{name: "owned by another uid", needRoot: true, wantInMsg: "owned by uid 1234", tamper: func(t *testing.T, entry string) {
			must(t, os.Chown(entry, 1234, 1234))
		}},
		{name: "group-writable", needRoot: true, wantInMsg: "mode 0775", tamper: func(t *testing.T, entry string) {
			must(t, os.Chmod(entry, 0o775))
		}},
		{name: "others-writable", needRoot: true, wantInMsg: "mode 0757", tamper: func(t *testing.T, entry string) {
			must(t, os.Chmod(entry, 0o757))
		}},
		{name: "a symlink elsewhere", wantInMsg: "is a symlink to", tamper: func(t *testing.T, entry string) {
			must(t, os.Rename(entry, entry+"-0.1.0"))
			must(t, os.Symlink(filepath.Base(entry)+"-0.1.0", entry))
		}},
		{name: "missing", wantInMsg: "does not exist", tamper: func(t *testing.T, entry string) {
			must(t, os.Remove(entry))
		}},
		{name: "a directory", wantInMsg: "not a regular file", tamper: func(t *testing.T, entry string) {
			must(t, os.Remove(entry))
			must(t, os.Mkdir(entry, 0o755))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needRoot {
				testenv.NeedRoot(t)
			}
			h := newHost(t)
			m := h.manager("0.1.0", func(o *Options) { o.RequireRoot = true })
			p, err := m.Prepare(context.Background(), h.section("0.2.0", 5), testNow)
			must(t, err)
			tt.tamper(t, h.opts.Entrypoint)
			before, _ := os.Lstat(h.opts.Entrypoint)
			err = m.Swap(context.Background(), p, "cmd", 1)
			wantCode(t, err, CodeEntrypointRefused)
			t.Log(err)
			if !strings.Contains(err.Error(), tt.wantInMsg) {
				t.Errorf("%v does not say %q", err, tt.wantInMsg)
			}
			if h.link(CurrentLink) != "" || h.exists(filepath.Join(h.slotsDir(), "bcd-a")) {
				t.Error("a slot was written for a refused entrypoint")
			}
			after, _ := os.Lstat(h.opts.Entrypoint)
			if (before == nil) != (after == nil) || before != nil && before.Mode() != after.Mode() {
				t.Errorf("the entrypoint changed: %v -> %v", before, after)
			}
		})
	}
}

// TestFirstUpdate adopts the install script's binary into slot a, puts the
// release into slot b and links everything as the spec says.
func TestFirstUpdate(t *testing.T) {
	h := newHost(t)
	h.update("0.1.0", h.section("0.2.0", 5))

	sd := h.slotsDir()
	if got := h.read(filepath.Join(sd, "bcd-a")); string(got) != string(h.oldBody) {
		t.Errorf("slot a holds %q, want the adopted binary", got)
	}
	if got := h.read(filepath.Join(sd, "bcd-b")); string(got) != string(binary("0.2.0")) {
		t.Errorf("slot b holds %q", got)
	}
	for path, mode := range map[string]os.FileMode{
		sd: 0o755, filepath.Join(sd, "bcd-a"): 0o755, filepath.Join(sd, "bcd-b"): 0o755,
		filepath.Join(sd, SlotsFile): 0o644, filepath.Join(h.opts.RecordsDir, UpgradeFile): 0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v (%v), want %04o", filepath.Base(path), fi.Mode().Perm(), err, mode)
		}
	}
	if c, p := h.link(CurrentLink), h.link(PreviousLink); c != "bcd-b" || p != "bcd-a" {
		t.Errorf("current -> %q, previous -> %q; want bcd-b and bcd-a (relative)", c, p)
	}
	target, err := os.Readlink(h.opts.Entrypoint)
	if err != nil || target != filepath.Join(sd, CurrentLink) {
		t.Errorf("entrypoint -> %q (%v), want %s", target, err, filepath.Join(sd, CurrentLink))
	}
	if got := h.read(h.opts.Entrypoint); string(got) != string(binary("0.2.0")) {
		t.Error("the entrypoint does not run the new binary")
	}
	slots := h.slots().Slots
	wantA := Slot{Version: "0.1.0", Sequence: 3, SHA256: digest(h.oldBody), Size: int64(len(h.oldBody))}
	wantB := Slot{Version: "0.2.0", Sequence: 5, SHA256: digest(binary("0.2.0")), Size: int64(len(binary("0.2.0")))}
	if slots[SlotA] != wantA || slots[SlotB] != wantB {
		t.Errorf("slots.json %+v, want a=%+v b=%+v", slots, wantA, wantB)
	}
	up, ok := h.upgradeRecord()
	want := upgradeRecord{Version: "0.2.0", Sequence: 5, FromSlot: SlotA, ToSlot: SlotB, FromVersion: "0.1.0",
		Deadline: testNow.Add(DefaultDeadline), CommandID: "cmd-0.2.0", Revision: 7, Started: testNow}
	if !ok || up != want {
		t.Errorf("upgrade.json %+v, want %+v", up, want)
	}
	if got := h.stagingEntries(); len(got) != 0 {
		t.Errorf("staging still holds %v", got)
	}
	if h.exists(h.opts.UnitDir) {
		t.Error("the systemd unit directory was written without Options.Systemd")
	}
}

// TestConfirmAndSecondUpdate: the new binary confirms (floor up,
// upgrade.json gone, never undone); the next update uses the other slot.
func TestConfirmAndSecondUpdate(t *testing.T) {
	h := newHost(t)
	h.update("0.1.0", h.section("0.2.0", 5))

	out, err := h.manager("0.2.0").Resume()
	must(t, err)
	if out.State != Pending || out.Version != "0.2.0" || !out.Deadline.Equal(testNow.Add(DefaultDeadline)) || out.CommandID != "cmd-0.2.0" {
		t.Fatalf("resume: %+v", out)
	}
	if _, err := h.manager("0.1.0").Confirm(); err == nil {
		t.Error("the old binary confirmed the new one")
	}
	h.confirm("0.2.0")
	if u := h.updateRecord(); u.Floor != 5 {
		t.Errorf("floor %d after confirming sequence 5", u.Floor)
	}
	if _, ok := h.upgradeRecord(); ok {
		t.Error("upgrade.json survived the confirmation")
	}
	if out, err := h.manager("0.2.0").Resume(); err != nil || out.State != None {
		t.Errorf("resume after confirm: %+v %v", out, err)
	}
	if did, err := h.manager("0.1.0").Rollback(); did || err != nil {
		t.Errorf("rollback of a confirmed update: %v %v", did, err)
	}
	if err := h.manager("0.2.0").SwapBack("late"); err == nil {
		t.Error("swapped back a confirmed update")
	}
	if h.link(CurrentLink) != "bcd-b" {
		t.Fatal("a confirmed update was undone")
	}

	h.update("0.2.0", h.section("0.3.0", 6))
	if c, p := h.link(CurrentLink), h.link(PreviousLink); c != "bcd-a" || p != "bcd-b" {
		t.Errorf("current -> %q, previous -> %q after the second update", c, p)
	}
	if got := h.slots().Slots[SlotA]; got.Version != "0.3.0" || got.Sequence != 6 {
		t.Errorf("slot a %+v", got)
	}
	if got := h.read(filepath.Join(h.slotsDir(), "bcd-a")); string(got) != string(binary("0.3.0")) {
		t.Errorf("slot a holds %q", got)
	}
	h.confirm("0.3.0")
	if u := h.updateRecord(); u.Floor != 6 {
		t.Errorf("floor %d", u.Floor)
	}
}

// TestDeadlineSwapBack: no Welcome by the deadline swaps back; the old
// binary records the failure, which is refused until ClearFailed; then the
// other slot's binary is taken without a download (step 5).
func TestDeadlineSwapBack(t *testing.T) {
	h := newHost(t)
	sec := h.section("0.2.0", 5)
	h.update("0.1.0", sec)

	later := func(o *Options) { o.Now = func() time.Time { return testNow.Add(DefaultDeadline + time.Second) } }
	nw := h.manager("0.2.0", later)
	out, err := nw.Resume()
	must(t, err)
	if out.State != Pending || !out.Deadline.Before(testNow.Add(DefaultDeadline+time.Second)) {
		t.Fatalf("resume past the deadline: %+v", out)
	}
	must(t, nw.SwapBack("no Welcome by the deadline"))
	if h.link(CurrentLink) != "bcd-a" {
		t.Fatalf("current -> %q after the swap back", h.link(CurrentLink))
	}
	if up, ok := h.upgradeRecord(); !ok || up.SwappedBack == nil || up.SwappedBack.Why != "no Welcome by the deadline" {
		t.Fatalf("upgrade.json after the swap back: %+v %v", up, ok)
	}
	if _, err := nw.Confirm(); err == nil {
		t.Error("confirmed a swapped-back update")
	}

	old := h.manager("0.1.0", later)
	out, err = old.Resume()
	must(t, err)
	if out.State != Failed || out.Version != "0.2.0" || out.FromVersion != "0.1.0" || out.CommandID != "cmd-0.2.0" || out.Revision != 7 {
		t.Fatalf("resume in the old binary: %+v", out)
	}
	if !strings.HasPrefix(out.Message, "bcd 0.2.0 did not start") {
		t.Errorf("message %q", out.Message)
	}
	u := h.updateRecord()
	if len(u.Failed) != 1 || u.Failed[0].Version != "0.2.0" || u.Failed[0].Reason != "bcd 0.2.0 did not start" {
		t.Errorf("update.json failed %+v", u.Failed)
	}
	if _, ok := h.upgradeRecord(); ok {
		t.Error("upgrade.json survived")
	}
	if out, err := old.Resume(); err != nil || out.State != None {
		t.Errorf("second resume: %+v %v", out, err)
	}

	_, err = old.Prepare(context.Background(), sec, testNow)
	wantCode(t, err, CodeFailedBefore)
	n, err := old.ClearFailed()
	if err != nil || n != 1 {
		t.Fatalf("clear failed: %d %v", n, err)
	}
	hits := h.hits.Load()
	sec.Signature = ""
	p, err := old.Prepare(context.Background(), sec, testNow)
	must(t, err)
	if h.hits.Load() != hits {
		t.Error("downloaded what the other slot holds")
	}
	must(t, old.Swap(context.Background(), p, "cmd-again", 8))
	if h.link(CurrentLink) != "bcd-b" {
		t.Errorf("current -> %q", h.link(CurrentLink))
	}
}

// TestResumeCurrentMovedWithoutMark: a crash between moving current back and
// marking upgrade.json still reads as a swap back.
func TestResumeCurrentMovedWithoutMark(t *testing.T) {
	h := newHost(t)
	h.update("0.1.0", h.section("0.2.0", 5))
	must(t, replaceSymlink(h.slotsDir(), CurrentLink, "bcd-a"))
	out, err := h.manager("0.1.0").Resume()
	must(t, err)
	if out.State != Failed || out.Message != "bcd 0.2.0 did not start" {
		t.Fatalf("%+v", out)
	}
}

// TestResumeNotTheNewBinary: current points at the new slot but this process
// is the old version (its exec failed): pending, but it cannot confirm.
func TestResumeNotTheNewBinary(t *testing.T) {
	h := newHost(t)
	h.update("0.1.0", h.section("0.2.0", 5))
	m := h.manager("0.1.0")
	out, err := m.Resume()
	must(t, err)
	if out.State != Pending || !strings.Contains(out.Message, "this process runs 0.1.0") {
		t.Fatalf("%+v", out)
	}
	if _, err := m.Confirm(); err == nil {
		t.Fatal("the old binary confirmed")
	}
}

// TestRollback is bcd update --rollback: only while upgrade.json exists and
// current points at its new slot.
func TestRollback(t *testing.T) {
	h := newHost(t)
	if did, err := h.manager("0.1.0").Rollback(); did || err != nil {
		t.Fatalf("rollback on a host that never updated: %v %v", did, err)
	}
	h.update("0.1.0", h.section("0.2.0", 5))
	prev := h.manager("0.1.0")
	did, err := prev.Rollback()
	if err != nil || !did {
		t.Fatalf("rollback: %v %v", did, err)
	}
	if h.link(CurrentLink) != "bcd-a" {
		t.Errorf("current -> %q", h.link(CurrentLink))
	}
	if up, ok := h.upgradeRecord(); !ok || up.SwappedBack == nil || up.SwappedBack.Why != RollbackWhy {
		t.Errorf("upgrade.json %+v", up)
	}
	if did, err := prev.Rollback(); did || err != nil {
		t.Errorf("second rollback: %v %v", did, err)
	}
	out, err := prev.Resume()
	if err != nil || out.State != Failed || !strings.Contains(out.Message, RollbackWhy) {
		t.Errorf("resume: %+v %v", out, err)
	}
}

// TestSwapRefusesWhilePending: one update at a time.
func TestSwapRefusesWhilePending(t *testing.T) {
	h := newHost(t)
	h.update("0.1.0", h.section("0.2.0", 5))
	m := h.manager("0.2.0")
	p, err := m.Prepare(context.Background(), h.section("0.3.0", 6), testNow)
	must(t, err)
	wantCode(t, m.Swap(context.Background(), p, "cmd", 2), CodeUpdatePending)
	if h.link(CurrentLink) != "bcd-b" {
		t.Error("swapped while another update was pending")
	}
}

// TestRerunAdoption: the install script reran after a self-update and left
// a plain file at the entrypoint: it goes into the current slot first, so
// the next update does not fall back to the old slot's binary.
func TestRerunAdoption(t *testing.T) {
	h := newHost(t)
	h.update("0.1.0", h.section("0.2.0", 5))
	h.confirm("0.2.0")

	rerun := []byte("#!/bin/sh\necho the install script's bcd 0.2.0, again\n")
	must(t, os.Remove(h.opts.Entrypoint))
	must(t, os.WriteFile(h.opts.Entrypoint, rerun, 0o755))

	h.update("0.2.0", h.section("0.3.0", 6))
	if got := h.read(filepath.Join(h.slotsDir(), "bcd-b")); string(got) != string(rerun) {
		t.Errorf("the current slot holds %q, want the rerun's binary", got)
	}
	if got := h.slots().Slots[SlotB]; got.Version != "0.2.0" || got.SHA256 != digest(rerun) {
		t.Errorf("slot b %+v", got)
	}
	if c, p := h.link(CurrentLink), h.link(PreviousLink); c != "bcd-a" || p != "bcd-b" {
		t.Errorf("current -> %q, previous -> %q", c, p)
	}
	if target, _ := os.Readlink(h.opts.Entrypoint); target != filepath.Join(h.slotsDir(), CurrentLink) {
		t.Errorf("entrypoint -> %q", target)
	}
}

// TestOtherSlotWithoutManifest is step 5: the other slot's binary is taken
// without a manifest only when its sequence is known and not below the floor.
func TestOtherSlotWithoutManifest(t *testing.T) {
	tests := []struct {
		name      string
		seq       int64 // slot b's recorded sequence
		floor     int64 // update.json's floor
		signature bool
		code      string // "" = taken
	}{
		{name: "known, at the floor", seq: 5, floor: 5},
		{name: "known, above the floor", seq: 5, floor: 4},
		{name: "unknown sequence", seq: 0, floor: 0, code: "RELEASE_UNTRUSTED"},
		{name: "below the floor", seq: 5, floor: 6, code: "RELEASE_ROLLBACK"},
		{name: "below the floor, even with a manifest", seq: 5, floor: 6, signature: true, code: "RELEASE_ROLLBACK"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHost(t)
			sd := h.slotsDir()
			must(t, os.MkdirAll(sd, 0o755))
			body := binary("0.2.0")
			must(t, os.WriteFile(filepath.Join(sd, "bcd-a"), h.oldBody, 0o755))
			must(t, os.WriteFile(filepath.Join(sd, "bcd-b"), body, 0o755))
			must(t, replaceSymlink(sd, CurrentLink, "bcd-a"))
			must(t, replaceSymlink(sd, PreviousLink, "bcd-b"))
			must(t, os.Remove(h.opts.Entrypoint))
			must(t, os.Symlink(filepath.Join(sd, CurrentLink), h.opts.Entrypoint))
			m := h.manager("0.1.0", func(o *Options) { o.ConfigFloor = 0 })
			must(t, m.writeSlots(slotsRecord{Slots: map[string]Slot{
				SlotA: {Version: "0.1.0", Sequence: 3, SHA256: digest(h.oldBody), Size: int64(len(h.oldBody))},
				SlotB: {Version: "0.2.0", Sequence: tt.seq, SHA256: digest(body), Size: int64(len(body))},
			}}))
			must(t, m.writeUpdate(updateRecord{Floor: tt.floor}))
			sec := h.section("0.2.0", max(tt.seq, 1))
			if !tt.signature {
				sec.Signature = ""
			}
			p, err := m.Prepare(context.Background(), sec, testNow)
			if tt.code != "" {
				wantCode(t, err, tt.code)
				return
			}
			must(t, err)
			if h.hits.Load() != 0 {
				t.Error("downloaded what the other slot holds")
			}
			must(t, m.Swap(context.Background(), p, "cmd", 1))
			if h.link(CurrentLink) != "bcd-b" {
				t.Errorf("current -> %q", h.link(CurrentLink))
			}
		})
	}
}

// TestOtherSlotChanged: a slot whose bytes are not what slots.json recorded
// is not taken without a manifest.
func TestOtherSlotChanged(t *testing.T) {
	h := newHost(t)
	sec := h.section("0.2.0", 5)
	h.update("0.1.0", sec)
	old := h.manager("0.1.0")
	must(t, old.SwapBack("test"))
	if _, err := old.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := old.ClearFailed(); err != nil {
		t.Fatal(err)
	}
	sec.Signature = ""
	p, err := old.Prepare(context.Background(), sec, testNow)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(h.slotsDir(), "bcd-b"), []byte("tampered"), 0o755))
	wantCode(t, old.Swap(context.Background(), p, "cmd", 1), CodeDigestMismatch)
	if h.link(CurrentLink) != "bcd-a" {
		t.Error("swapped to a tampered slot")
	}
}

// TestLockSerializes: a rollback waits while another update holds the lock.
func TestLockSerializes(t *testing.T) {
	h := newHost(t)
	m := h.manager("0.1.0")
	unlock, err := m.lock()
	must(t, err)
	done := make(chan struct{})
	go func() {
		_, _ = h.manager("0.1.0").Rollback()
		close(done)
	}()
	select {
	case <-done:
		t.Fatal("rollback ran while the lock was held")
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("rollback did not run after the lock was released")
	}
}
