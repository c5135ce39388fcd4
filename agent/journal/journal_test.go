package journal

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/better-compute/bcd/protocol"
)

func open(t *testing.T, path, node string, opts Options) *Journal {
	t.Helper()
	j, err := Open(path, node, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	return j
}

func TestAppendAckSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	j := open(t, path, "node_a", Options{})
	for i, state := range []string{protocol.StateRunning, protocol.StateSucceeded} {
		st, err := j.AppendStatus(protocol.Status{CommandID: "cmd_1", State: state})
		if err != nil {
			t.Fatal(err)
		}
		if st.Seq != uint64(i+1) {
			t.Fatalf("seq = %d, want %d", st.Seq, i+1)
		}
	}
	if _, err := j.AppendEvent(protocol.Event{Kind: protocol.EventLog, Message: "hello"}); err != nil {
		t.Fatal(err)
	}
	if n, err := j.Ack(1); err != nil || n != 1 {
		t.Fatalf("Ack(1) = %d, %v; want 1 entry", n, err)
	}
	j.Close()

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("journal mode %04o, want 0600", fi.Mode().Perm())
	}

	j = open(t, path, "node_a", Options{})
	pending, err := j.Pending()
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 2 || j.Len() != 2 {
		t.Fatalf("pending = %d entries (Len %d), want 2", len(pending), j.Len())
	}
	var st protocol.Status
	if err := json.Unmarshal(pending[0].Data, &st); err != nil {
		t.Fatal(err)
	}
	if pending[0].Type != TypeStatus || st.Seq != 2 || st.State != protocol.StateSucceeded {
		t.Errorf("first pending = %s %+v, want the SUCCEEDED status seq 2", pending[0].Type, st)
	}
	if pending[1].Type != TypeEvent || pending[1].Seq != 3 {
		t.Errorf("second pending = %s seq %d, want the event seq 3", pending[1].Type, pending[1].Seq)
	}
	// Sequence numbers are never reused, even after everything was acknowledged.
	if _, err := j.Ack(3); err != nil {
		t.Fatal(err)
	}
	st, err = j.AppendStatus(protocol.Status{CommandID: "cmd_2", State: protocol.StateRunning})
	if err != nil {
		t.Fatal(err)
	}
	if st.Seq != 4 {
		t.Errorf("seq after acking everything = %d, want 4", st.Seq)
	}
}

func TestForeignNodeRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	j := open(t, path, "node_old", Options{})
	j.Close()
	_, err := Open(path, "node_new", Options{})
	var fe *ForeignError
	if !errors.As(err, &fe) {
		t.Fatalf("Open by another node = %v, want a ForeignError", err)
	}
	if want := "the journal belongs to node node_old, not node_new"; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	owner, err := Owner(path)
	if err != nil || owner != "node_old" {
		t.Errorf("Owner = %q, %v; want node_old", owner, err)
	}
}

func TestCorruptFileMovedAside(t *testing.T) {
	for _, garbage := range [][]byte{
		[]byte(strings.Repeat("this is not a bbolt file\n", 400)),
		[]byte("short"),
		make([]byte, 8192), // zeros: a file truncated to holes
	} {
		testCorruptFileMovedAside(t, garbage)
	}
}

func testCorruptFileMovedAside(t *testing.T, garbage []byte) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	if err := os.WriteFile(path, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 0)
	j := open(t, path, "node_a", Options{Now: func() time.Time { return now }})
	defer j.Close()
	if _, err := j.AppendStatus(protocol.Status{CommandID: "c", State: protocol.StateRunning}); err != nil {
		t.Fatal(err)
	}
	moved, err := os.ReadFile(path + ".corrupt-1700000000")
	if err != nil {
		t.Fatalf("corrupt journal not moved aside: %v", err)
	}
	if string(moved) != string(garbage) {
		t.Error("the moved-aside file is not the corrupt journal")
	}
}

func TestLockedJournalIsNotMovedAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	open(t, path, "node_a", Options{})
	_, err := Open(path, "node_a", Options{LockTimeout: 100 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second Open = %v, want a lock error", err)
	}
	matches, _ := filepath.Glob(path + ".corrupt-*")
	if len(matches) != 0 {
		t.Errorf("a locked journal was moved aside: %v", matches)
	}
}

func TestBoundedDropsEventsFirst(t *testing.T) {
	j := open(t, filepath.Join(t.TempDir(), FileName), "node_a", Options{MaxEntries: 3})
	mustStatus := func(id string) {
		if _, err := j.AppendStatus(protocol.Status{CommandID: id, State: protocol.StateSucceeded}); err != nil {
			t.Fatal(err)
		}
	}
	mustStatus("s1")                                                                  // seq 1
	if _, err := j.AppendEvent(protocol.Event{Kind: protocol.EventLog}); err != nil { // seq 2
		t.Fatal(err)
	}
	mustStatus("s3") // seq 3
	mustStatus("s4") // seq 4: drops the event (seq 2)
	mustStatus("s5") // seq 5: no event left, drops the oldest status (seq 1)
	pending, err := j.Pending()
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, e := range pending {
		seqs = append(seqs, e.Seq)
	}
	if len(seqs) != 3 || seqs[0] != 3 || seqs[1] != 4 || seqs[2] != 5 {
		t.Errorf("pending seqs = %v, want [3 4 5]", seqs)
	}
	if j.Len() != 3 {
		t.Errorf("Len = %d, want 3", j.Len())
	}
}

// TestBoundedKeepsBootNonces: a full site agent's journal drops its other
// events before a boot.nonce, however old: the machine that booted with a
// nonce the control plane never hears of cannot join.
func TestBoundedKeepsBootNonces(t *testing.T) {
	j := open(t, filepath.Join(t.TempDir(), FileName), "node_a", Options{MaxEntries: 3})
	kinds := []string{protocol.EventBootNonce, protocol.EventMachineBooted, protocol.EventBootNonce, // seqs 1-3
		protocol.EventMachineBooted, // seq 4: drops the booted event (seq 2), not the older nonce
		protocol.EventBootNonce,     // seq 5: drops the booted event (seq 4)
		protocol.EventBootNonce,     // seq 6: only nonces left: drops the oldest (seq 1)
	}
	for _, k := range kinds {
		if _, err := j.AppendEvent(protocol.Event{Kind: k}); err != nil {
			t.Fatal(err)
		}
	}
	pending, err := j.Pending()
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, e := range pending {
		seqs = append(seqs, e.Seq)
	}
	if len(seqs) != 3 || seqs[0] != 3 || seqs[1] != 5 || seqs[2] != 6 {
		t.Errorf("pending seqs = %v, want [3 5 6]: the nonces, the oldest of them dropped only when nothing else was left", seqs)
	}
}

func TestState(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	j := open(t, path, "node_a", Options{})
	if v, err := j.State("reboot"); err != nil || v != nil {
		t.Fatalf("State of a missing key = %q, %v", v, err)
	}
	if err := j.SetState("reboot", []byte(`{"command_id":"c1"}`)); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j = open(t, path, "node_a", Options{})
	v, err := j.State("reboot")
	if err != nil || string(v) != `{"command_id":"c1"}` {
		t.Fatalf("State after reopen = %q, %v", v, err)
	}
	if err := j.DeleteState("reboot"); err != nil {
		t.Fatal(err)
	}
	if v, _ := j.State("reboot"); v != nil {
		t.Errorf("State after delete = %q", v)
	}
}

func TestOwnerOfMissingJournal(t *testing.T) {
	_, err := Owner(filepath.Join(t.TempDir(), FileName))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Owner of nothing = %v, want ErrNotExist", err)
	}
}

// TestLenUnderConcurrentAppendAndAck appends from some goroutines while another
// acknowledges, as a site agent journals boot events while its session applies
// the gateway's Acks. Len must stay the outbox's true size: one that drifted
// above it would make a journal far from full drop its oldest events as if it
// were full (a boot.nonce among them, leaving that machine's ramdisk unable to join).
func TestLenUnderConcurrentAppendAndAck(t *testing.T) {
	const writers, each = 4, 300
	j := open(t, filepath.Join(t.TempDir(), FileName), "node_a", Options{MaxEntries: writers * each})
	var wg sync.WaitGroup
	var last atomic.Uint64
	for range writers {
		wg.Go(func() {
			for range each {
				ev, err := j.AppendEvent(protocol.Event{Kind: protocol.EventLog, Message: "booted"})
				if err != nil {
					t.Error(err)
					return
				}
				last.Store(max(last.Load(), ev.Seq))
			}
		})
	}
	stop := make(chan struct{})
	acked := make(chan struct{})
	go func() {
		defer close(acked)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if s := last.Load(); s > 0 {
				if _, err := j.Ack(s); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-acked
	pending, err := j.Pending()
	if err != nil {
		t.Fatal(err)
	}
	if j.Len() != len(pending) {
		t.Fatalf("Len = %d after concurrent appends and acks, the outbox holds %d", j.Len(), len(pending))
	}
}

func TestAppendEventsIsOneBatch(t *testing.T) {
	j := open(t, filepath.Join(t.TempDir(), FileName), "node_a", Options{MaxEntries: 5})
	if _, err := j.AppendStatus(protocol.Status{CommandID: "cmd_1", State: protocol.StateRunning}); err != nil {
		t.Fatal(err)
	}
	in := []protocol.Event{{Kind: protocol.EventLog, Message: "a"}, {Kind: protocol.EventLog, Message: "b"}, {Kind: protocol.EventLog, Message: "c"}}
	out, err := j.AppendEvents(in)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range out {
		if ev.Seq != uint64(i+2) || ev.Message != in[i].Message {
			t.Errorf("event %d = seq %d %q, want seq %d %q", i, ev.Seq, ev.Message, i+2, in[i].Message)
		}
	}
	if in[0].Seq != 0 {
		t.Error("AppendEvents changed its argument")
	}
	// Beyond MaxEntries within one batch: the oldest events go, the status stays.
	if _, err := j.AppendEvents([]protocol.Event{{Kind: protocol.EventLog, Message: "d"}, {Kind: protocol.EventLog, Message: "e"}, {Kind: protocol.EventLog, Message: "f"}}); err != nil {
		t.Fatal(err)
	}
	pending, err := j.Pending()
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, e := range pending {
		got = append(got, e.Seq)
	}
	if want := []uint64{1, 4, 5, 6, 7}; !slices.Equal(got, want) || j.Len() != 5 {
		t.Errorf("pending seqs %v (Len %d), want %v", got, j.Len(), want)
	}
	// An entry that does not encode stores none of the batch.
	if _, err := j.AppendEvents([]protocol.Event{{Kind: protocol.EventLog}, {Kind: protocol.EventLog, Data: json.RawMessage("{")}}); err == nil {
		t.Fatal("a batch with an event that does not encode was stored")
	}
	if after, _ := j.Pending(); len(after) != 5 || j.Len() != 5 {
		t.Errorf("after a refused batch: %d pending (Len %d), want 5", len(after), j.Len())
	}
	if ev, err := j.AppendEvent(protocol.Event{Kind: protocol.EventLog}); err != nil || ev.Seq != 8 {
		t.Errorf("next event: seq %d, %v; want 8 (a refused batch takes no sequence numbers)", ev.Seq, err)
	}
}

// TestFullJournalKeepsStatuses: statuses, the commands' results, never give way
// to events. A journal full of statuses (and a boot nonce) refuses a new event
// with ErrFull and keeps every status; one that also holds events drops those
// first.
func TestFullJournalKeepsStatuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before is what is journaled first ("s" a status, "e" an event, "n" a
		// boot.nonce); then three events are appended one by one and three in
		// one batch.
		before string
		want   []uint64
		// full: the appends are refused with ErrFull.
		full bool
	}{
		{"statuses only", "sssss", []uint64{1, 2, 3, 4, 5}, true},
		{"statuses and a nonce", "ssnss", []uint64{1, 2, 3, 4, 5}, true},
		{"statuses and events", "sesse", []uint64{1, 3, 4, 10, 11}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := open(t, filepath.Join(t.TempDir(), FileName), "node_a", Options{MaxEntries: 5})
			for _, c := range tc.before {
				var err error
				switch c {
				case 's':
					_, err = j.AppendStatus(protocol.Status{CommandID: "c", State: protocol.StateSucceeded})
				case 'e':
					_, err = j.AppendEvent(protocol.Event{Kind: protocol.EventLog})
				case 'n':
					_, err = j.AppendEvent(protocol.Event{Kind: protocol.EventBootNonce})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			check := func(err error) {
				t.Helper()
				if tc.full && !errors.Is(err, ErrFull) || !tc.full && err != nil {
					t.Fatalf("append: %v, want ErrFull %v", err, tc.full)
				}
			}
			for range 3 {
				_, err := j.AppendEvent(protocol.Event{Kind: protocol.EventMachineBooted})
				check(err)
			}
			batch := []protocol.Event{{Kind: protocol.EventLog}, {Kind: protocol.EventLog}, {Kind: protocol.EventLog}}
			_, err := j.AppendEvents(batch)
			check(err)
			if got := pendingSeqs(t, j); !slices.Equal(got, tc.want) {
				t.Errorf("pending seqs = %v, want %v", got, tc.want)
			}
			if j.Len() != 5 {
				t.Errorf("Len = %d, want 5", j.Len())
			}
		})
	}
}

func pendingSeqs(t *testing.T, j *Journal) []uint64 {
	t.Helper()
	pending, err := j.Pending()
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, e := range pending {
		seqs = append(seqs, e.Seq)
	}
	return seqs
}

// TestFullJournalDropsWithoutReadingIt: an event taken in by a full journal whose
// oldest entries are statuses costs no more than one taken in by a journal with
// room: the drop finds the oldest event by its class index instead of reading and
// decoding every status before it.
func TestFullJournalDropsWithoutReadingIt(t *testing.T) {
	const max = 500
	full := open(t, filepath.Join(t.TempDir(), FileName), "node_a", Options{MaxEntries: max})
	roomy := open(t, filepath.Join(t.TempDir(), FileName), "node_a", Options{MaxEntries: 2 * max})
	for _, j := range []*Journal{full, roomy} {
		for range max - 1 {
			if _, err := j.AppendStatus(protocol.Status{CommandID: "c", State: protocol.StateSucceeded}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ev := protocol.Event{Kind: protocol.EventMachineBooted, Data: json.RawMessage(`{"mac":"52:54:00:00:00:01"}`)}
	appendEv := func(j *Journal) func() {
		return func() {
			if _, err := j.AppendEvent(ev); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendEv(full)() // the journal is full from here on: each event drops the previous one
	dropping := testing.AllocsPerRun(50, appendEv(full))
	// roomy grows by 51 entries meanwhile: it never drops.
	growing := testing.AllocsPerRun(50, appendEv(roomy))
	if full.Len() != max {
		t.Fatalf("Len = %d, want %d", full.Len(), max)
	}
	if dropping > growing+50 {
		t.Errorf("an append that drops costs %.0f allocations, one that does not %.0f: the drop reads the journal", dropping, growing)
	}
}

// TestJournalWithoutIndexesIsIndexedAtOpen: a journal written before the class
// indexes existed gets them when it opens, and then drops by them.
func TestJournalWithoutIndexesIsIndexedAtOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	j, err := Open(path, "node_a", Options{MaxEntries: 3})
	if err != nil {
		t.Fatal(err)
	}
	j.AppendEvent(protocol.Event{Kind: protocol.EventBootNonce})                    // seq 1
	j.AppendStatus(protocol.Status{CommandID: "c", State: protocol.StateSucceeded}) // seq 2
	j.AppendEvent(protocol.Event{Kind: protocol.EventLog})                          // seq 3
	if err := j.db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{[]byte("idx_event"), []byte("idx_nonce"), []byte("idx_status")} {
			if tx.Bucket(name) == nil {
				continue
			}
			if err := tx.DeleteBucket(name); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j = open(t, path, "node_a", Options{MaxEntries: 3})
	j.AppendStatus(protocol.Status{CommandID: "d", State: protocol.StateSucceeded}) // seq 4: drops the event (3)
	j.AppendStatus(protocol.Status{CommandID: "e", State: protocol.StateSucceeded}) // seq 5: drops the nonce (1)
	if got, want := pendingSeqs(t, j), []uint64{2, 4, 5}; !slices.Equal(got, want) {
		t.Errorf("pending seqs = %v, want %v", got, want)
	}
}
