package journal

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/protocol"
)

// FileName is the journal's name under data_dir when [journal] path is not set.
const FileName = "journal.db"

// DefaultMaxEntries bounds the unacknowledged entries when Options leaves it 0; it is
// config.DefaultJournalEntries.
const DefaultMaxEntries = 10000

// Entry types: the frame type each entry is sent as.
const (
	TypeStatus = protocol.FrameStatus
	TypeEvent  = protocol.FrameEvent
)

var (
	bucketMeta   = []byte("meta")
	bucketOutbox = []byte("outbox")
	bucketState  = []byte("state")
	// The class indexes hold every outbox key (the value empty) by what a full
	// journal drops first: events, then boot.nonce events, then statuses. A drop
	// is then the first key of one of them, not a scan that reads and decodes
	// the outbox from its oldest entry (10,000 statuses read for every event a
	// full journal took in).
	bucketIdxEvent  = []byte("idx_event")
	bucketIdxNonce  = []byte("idx_nonce")
	bucketIdxStatus = []byte("idx_status")
	// dropOrder is the order a full journal drops classes in.
	dropOrder  = [][]byte{bucketIdxEvent, bucketIdxNonce, bucketIdxStatus}
	keyNodeID  = []byte("node_id")
	keyNextSeq = []byte("next_seq")
)

// ErrFull is what appending events returns when none of them could be journaled:
// the journal holds max_entries statuses (and boot nonces, which a plain event does
// not displace either), and a status never gives way to an event.
var ErrFull = errors.New("the journal is full of statuses: the events are not journaled")

// Entry is one unacknowledged status or event.
type Entry struct {
	// Seq is the journal sequence number, also inside Data.
	Seq uint64
	// Type is TypeStatus or TypeEvent: the frame type to send Data as.
	Type string
	// Data is the protocol.Status or protocol.Event, Seq included.
	Data json.RawMessage
}

type storedEntry struct {
	Type string          `json:"type"`
	Data json.RawMessage `json:"data"`
}

// ForeignError is returned by Open for a journal another node wrote.
type ForeignError struct {
	// Owner is the node the journal belongs to; Want the node that opened it.
	Owner, Want string
}

func (e *ForeignError) Error() string {
	return fmt.Sprintf("the journal belongs to node %s, not %s", e.Owner, e.Want)
}

// Options tune Open. The zero value is the daemon's default.
type Options struct {
	// MaxEntries bounds the unacknowledged entries; 0 means DefaultMaxEntries.
	MaxEntries int
	// LockTimeout is how long Open waits for another process holding the file
	// (another bcd node); 0 means 2 seconds.
	LockTimeout time.Duration
	// Logger receives the warnings: a corrupt file moved aside, entries dropped.
	// nil discards them.
	Logger *slog.Logger
	// Now stamps the name of a corrupt file moved aside; nil means time.Now.
	Now func() time.Time
}

// Journal is an open journal. Its methods are safe for concurrent use.
type Journal struct {
	db     *bolt.DB
	path   string
	nodeID string
	max    int
	log    *slog.Logger
	// count is the number of entries in the outbox. One process holds the file
	// (bbolt's flock), so it is kept here instead of being counted per append.
	// countMu is held across each write transaction that changes the outbox and
	// the count's update after it: bbolt serializes the transactions but not
	// what follows their commit, and an Ack's decrement landing between an
	// append's commit and its store was lost, so the count crept above the
	// outbox and the journal dropped entries as if full long before it was.
	countMu sync.Mutex
	count   atomic.Int64
}

// Open opens (or creates) the journal at path for nodeID. A journal of another node
// is refused with a *ForeignError; a file that is not a journal is moved aside as
// <path>.corrupt-<unix time> and a new journal starts.
func Open(path, nodeID string, opts Options) (*Journal, error) {
	if !protocol.ValidNodeID(nodeID) {
		return nil, fmt.Errorf("journal: node id %q is not valid", nodeID)
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	if err := checkFile(path); err != nil {
		return nil, err
	}
	j := &Journal{path: path, nodeID: nodeID, max: opts.MaxEntries, log: opts.Logger}
	err := j.open(opts.LockTimeout)
	if err != nil && isCorrupt(err) {
		aside := path + ".corrupt-" + strconv.FormatInt(opts.Now().Unix(), 10)
		if rerr := os.Rename(path, aside); rerr != nil {
			return nil, fmt.Errorf("journal %s does not open (%v) and cannot be moved aside: %w", path, err, rerr)
		}
		opts.Logger.Warn("the journal did not open; moved it aside and started a new one",
			"path", path, "moved_to", aside, "error", err.Error())
		err = j.open(opts.LockTimeout)
	}
	if err != nil {
		return nil, err
	}
	return j, nil
}

// checkFile refuses a journal path that exists but is not a regular file (a FIFO,
// a directory, a device), naming it and what it is. bbolt would otherwise open it:
// a FIFO opened read-write fails only later with "illegal seek", and such a file
// must be neither moved aside as corrupt nor written into.
func checkFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return nil // missing: a new journal starts; other errors surface in bbolt's open
	}
	if err := secretfile.Regular(path, fi); err != nil {
		return fmt.Errorf("journal %w", err)
	}
	return nil
}

// open opens the file and claims or checks its owner. Any error that is not about
// the file's content (a lock held, permissions, a full disk) is an *os.PathError or
// errno and is returned as is, so that only a damaged file is moved aside.
func (j *Journal) open(timeout time.Duration) (err error) {
	db, err := bolt.Open(j.path, 0o600, &bolt.Options{Timeout: timeout})
	if err != nil {
		if errors.Is(err, berrors.ErrTimeout) {
			return fmt.Errorf("journal %s is locked by another process (is bcd already running?): %w", j.path, err)
		}
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	defer func() {
		// A damaged page can make bbolt panic on first read; that is a
		// corrupt file, not a crash of the agent.
		if r := recover(); r != nil {
			err = &corruptError{fmt.Errorf("journal %s: reading it panicked: %v", j.path, r)}
		}
		if err != nil {
			db.Close()
		}
	}()
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range [][]byte{bucketMeta, bucketOutbox, bucketState} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return &corruptError{err}
			}
		}
		if err := ensureIndexes(tx); err != nil {
			return err
		}
		meta := tx.Bucket(bucketMeta)
		switch owner := string(meta.Get(keyNodeID)); owner {
		case "":
			if err := meta.Put(keyNodeID, []byte(j.nodeID)); err != nil {
				return err
			}
		case j.nodeID:
		default:
			return &ForeignError{Owner: owner, Want: j.nodeID}
		}
		j.count.Store(int64(tx.Bucket(bucketOutbox).Stats().KeyN))
		return nil
	})
	if err != nil {
		var fe *ForeignError
		if errors.As(err, &fe) {
			return err
		}
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	j.db = db
	return nil
}

type corruptError struct{ err error }

func (e *corruptError) Error() string { return e.err.Error() }
func (e *corruptError) Unwrap() error { return e.err }

// isCorrupt tells a file whose content is damaged from one that cannot be reached
// (permissions, a lock, a read-only or full disk): only the first may be moved aside.
func isCorrupt(err error) bool {
	var ce *corruptError
	if errors.As(err, &ce) {
		return true
	}
	var fe *ForeignError
	var pe *fs.PathError
	var errno syscall.Errno
	switch {
	case errors.As(err, &fe), errors.Is(err, berrors.ErrTimeout):
		return false
	case errors.As(err, &pe), errors.As(err, &errno):
		return false
	}
	return true
}

// Path is the journal's file.
func (j *Journal) Path() string { return j.path }

// NodeID is the node the journal belongs to.
func (j *Journal) NodeID() string { return j.nodeID }

// Close closes the file.
func (j *Journal) Close() error { return j.db.Close() }

// Owner reads the node id recorded in the journal at path without claiming it. It
// returns an error wrapping fs.ErrNotExist when there is no journal.
func Owner(path string) (string, error) {
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("journal: %w", err)
	}
	if err := checkFile(path); err != nil {
		return "", err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 2 * time.Second})
	if err != nil {
		return "", fmt.Errorf("journal %s: %w", path, err)
	}
	defer db.Close()
	var owner string
	err = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta); b != nil {
			owner = string(b.Get(keyNodeID))
		}
		return nil
	})
	return owner, err
}

// ensureIndexes builds the class indexes of a journal written before they existed
// (one scan, at open); a journal that has them is left as it is.
func ensureIndexes(tx *bolt.Tx) error {
	if tx.Bucket(bucketIdxEvent) != nil && tx.Bucket(bucketIdxNonce) != nil && tx.Bucket(bucketIdxStatus) != nil {
		return nil
	}
	for _, name := range dropOrder {
		if tx.Bucket(name) != nil {
			if err := tx.DeleteBucket(name); err != nil {
				return &corruptError{err}
			}
		}
		if _, err := tx.CreateBucket(name); err != nil {
			return &corruptError{err}
		}
	}
	return tx.Bucket(bucketOutbox).ForEach(func(k, v []byte) error {
		var se storedEntry
		if len(k) != 8 || json.Unmarshal(v, &se) != nil {
			// Pending skips it too; as a status it is dropped last.
			se.Type = TypeStatus
		}
		return tx.Bucket(classOf(se.Type, se.Data)).Put(k, nil)
	})
}

// classOf is the index an entry of typ with data belongs to.
func classOf(typ string, data []byte) []byte {
	if typ != TypeEvent {
		return bucketIdxStatus
	}
	var ev struct {
		Kind string `json:"kind"`
	}
	if json.Unmarshal(data, &ev) == nil && ev.Kind == protocol.EventBootNonce {
		return bucketIdxNonce
	}
	return bucketIdxEvent
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// AppendStatus stores st under the next sequence number and returns it with Seq set.
func (j *Journal) AppendStatus(st protocol.Status) (protocol.Status, error) {
	_, err := j.append(TypeStatus, 1, func(_ int, seq uint64) ([]byte, error) {
		st.Seq = seq
		return json.Marshal(st)
	})
	return st, err
}

// AppendEvent stores ev under the next sequence number and returns it with Seq set.
func (j *Journal) AppendEvent(ev protocol.Event) (protocol.Event, error) {
	evs, err := j.AppendEvents([]protocol.Event{ev})
	if err != nil {
		return ev, err
	}
	return evs[0], nil
}

// AppendEvents stores evs under consecutive sequence numbers in one transaction
// (one write to disk for all of them, which is why a storm's events come in
// batches) and returns them with Seq set. Either all are stored or none.
func (j *Journal) AppendEvents(evs []protocol.Event) ([]protocol.Event, error) {
	out := make([]protocol.Event, len(evs))
	copy(out, evs)
	_, err := j.append(TypeEvent, len(out), func(i int, seq uint64) ([]byte, error) {
		out[i].Seq = seq
		return json.Marshal(out[i])
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// append stores n entries of typ in one transaction; encode makes the i-th with its
// sequence number. It returns the first entry stored.
func (j *Journal) append(typ string, n int, encode func(i int, seq uint64) ([]byte, error)) (Entry, error) {
	var e Entry
	var dropped []uint64
	var count int64
	var refused int
	if n <= 0 {
		return Entry{}, nil
	}
	j.countMu.Lock()
	defer j.countMu.Unlock()
	err := j.db.Update(func(tx *bolt.Tx) error {
		dropped, refused = dropped[:0], 0
		meta := tx.Bucket(bucketMeta)
		seq := uint64(1)
		if v := meta.Get(keyNextSeq); len(v) == 8 {
			seq = binary.BigEndian.Uint64(v)
		}
		if err := meta.Put(keyNextSeq, seqKey(seq+uint64(n))); err != nil {
			return err
		}
		out := tx.Bucket(bucketOutbox)
		c := j.count.Load()
		for i := 0; i < n; i++ {
			data, err := encode(i, seq+uint64(i))
			if err != nil {
				return err
			}
			stored, err := json.Marshal(storedEntry{Type: typ, Data: data})
			if err != nil {
				return err
			}
			key := seqKey(seq + uint64(i))
			if err := out.Put(key, stored); err != nil {
				return err
			}
			class := bucketIdxStatus
			if typ == TypeEvent {
				class = classOf(typ, data)
			}
			if err := tx.Bucket(class).Put(key, nil); err != nil {
				return err
			}
			if i == 0 {
				e = Entry{Seq: seq, Type: typ, Data: data}
			}
			c++
			for c > int64(j.max) {
				s, err := dropOldest(tx)
				if err != nil {
					return err
				}
				if s >= seq {
					refused++
				}
				dropped = append(dropped, s)
				c--
			}
		}
		if refused == n && typ == TypeEvent {
			return ErrFull // and the transaction rolls back: nothing changed
		}
		count = c
		return nil
	})
	if err != nil {
		return Entry{}, fmt.Errorf("journal: append %s: %w", typ, err)
	}
	j.count.Store(count)
	switch {
	case refused > 0 && refused == len(dropped):
		// Nothing older could give way: the journal holds statuses (and
		// boot nonces) only, and an event never displaces either.
		j.log.Warn("journal full of statuses: new events not journaled", "max_entries", j.max, "refused", refused)
	case len(dropped) > 0:
		j.log.Warn("journal full: dropped the oldest unacknowledged entries", "max_entries", j.max, "dropped_seqs", dropped)
	}
	return e, nil
}

// dropOldest deletes the oldest event that is not a boot.nonce; when every event
// is one, the oldest boot.nonce; when there is no event, the oldest status. A
// boot.nonce goes last among events because a nonce the control plane never
// hears of leaves the machine that booted with it unable to join (its ramdisk is
// refused NONCE_UNKNOWN until the lifecycle power-cycles it, minutes later),
// where a lost machine.booted or log event only thins a timeline. A status, a
// command's result the control plane waits for, never gives way to an event: an
// event appended to a journal full of statuses is the one dropped. Each choice is
// the first key of a class index, so a drop reads nothing of the outbox.
func dropOldest(tx *bolt.Tx) (uint64, error) {
	for _, name := range dropOrder {
		idx := tx.Bucket(name)
		k, _ := idx.Cursor().First()
		if k == nil {
			continue
		}
		key := append([]byte(nil), k...)
		if err := idx.Delete(key); err != nil {
			return 0, err
		}
		return binary.BigEndian.Uint64(key), tx.Bucket(bucketOutbox).Delete(key)
	}
	return 0, errors.New("nothing to drop")
}

// Pending returns every unacknowledged entry in sequence order.
func (j *Journal) Pending() ([]Entry, error) {
	var entries []Entry
	err := j.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketOutbox).ForEach(func(k, v []byte) error {
			var se storedEntry
			if len(k) != 8 || json.Unmarshal(v, &se) != nil {
				// Skipped rather than fatal: one bad entry must not stop
				// every later status from reaching the gateway.
				return nil
			}
			entries = append(entries, Entry{Seq: binary.BigEndian.Uint64(k), Type: se.Type, Data: se.Data})
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return entries, nil
}

// Len is the number of unacknowledged entries.
func (j *Journal) Len() int {
	return int(j.count.Load())
}

// Ack removes every entry up to and including seq and returns how many went.
func (j *Journal) Ack(seq uint64) (int, error) {
	n := 0
	j.countMu.Lock()
	defer j.countMu.Unlock()
	err := j.db.Update(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketOutbox).Cursor()
		for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= seq; k, _ = c.First() {
			if err := c.Delete(); err != nil {
				return err
			}
			n++
		}
		for _, name := range dropOrder {
			c := tx.Bucket(name).Cursor()
			for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) <= seq; k, _ = c.First() {
				if err := c.Delete(); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("journal: ack %d: %w", seq, err)
	}
	j.count.Add(int64(-n))
	return n, nil
}

// SetState stores a small value under key, replacing what was there.
func (j *Journal) SetState(key string, value []byte) error {
	err := j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketState).Put([]byte(key), value)
	})
	if err != nil {
		return fmt.Errorf("journal: set %s: %w", key, err)
	}
	return nil
}

// State returns the value stored under key, or nil when there is none.
func (j *Journal) State(key string) ([]byte, error) {
	var v []byte
	err := j.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketState).Get([]byte(key)); b != nil {
			v = append([]byte(nil), b...)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("journal: get %s: %w", key, err)
	}
	return v, nil
}

// DeleteState removes key.
func (j *Journal) DeleteState(key string) error {
	err := j.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketState).Delete([]byte(key))
	})
	if err != nil {
		return fmt.Errorf("journal: delete %s: %w", key, err)
	}
	return nil
}
