package gateway

import (
	"sync"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// Bounds of the ingester.
const (
	// ingestQueue bounds the frames read and not yet stored, of the sessions with
	// priority and of the others apart (so that a thousand ramdisks filling theirs
	// never stop the site agent's reader);
	// a reader that finds it full waits, and its agent with it.
	ingestQueue = 4096
	// ingestBatch bounds the frames one round stores; of them, a round takes at
	// most ingestFirst from sessions with priority while others wait.
	ingestBatch = 256
	ingestFirst = 192
)

// ingester stores the statuses and events every session reads. Readers queue
// their frames; one worker takes what is queued, at least one frame, groups it by
// session and stores each session's share in order, its events in one transaction
// and acknowledged with one ack. A storm's events then cost serve a transaction and
// an ack per batch rather than per event, and a session costs no goroutine more
// than its reader and writer. One worker keeps every session's frames in the order
// they were read, and the store has one writer anyway. A site agent's session
// (whose context has store.WithPriority) queues apart and goes first: its stream
// carries the boot nonces every ramdisk of its site waits for to join, and in a
// storm a thousand ramdisks' statuses queue too. The worker runs while there is
// work and exits when the queues are empty.
type ingester struct {
	mu      sync.Mutex
	space   sync.Cond    // signalled when the worker takes frames out
	first   []ingestItem // from sessions with priority
	rest    []ingestItem
	running bool
}

// ingesters are the server's two: one for sessions with priority, one for the rest.
type ingesters [2]ingester

func (is *ingesters) put(ss *session, f protocol.Frame) {
	if store.HasPriority(ss.ctx) {
		is[0].put(ss, f)
		return
	}
	is[1].put(ss, f)
}

type ingestItem struct {
	ss *session
	f  protocol.Frame
}

// put queues f, waiting while the queue is full.
func (in *ingester) put(ss *session, f protocol.Frame) {
	in.mu.Lock()
	if in.space.L == nil {
		in.space.L = &in.mu
	}
	prio := store.HasPriority(ss.ctx)
	for ss.ctx.Err() == nil && (prio && len(in.first) >= ingestQueue || !prio && len(in.rest) >= ingestQueue) {
		in.space.Wait()
	}
	if ss.ctx.Err() != nil || ss.failed.Load() {
		in.mu.Unlock()
		return // the session ended; the agent replays what it did not see acknowledged
	}
	if prio {
		in.first = append(in.first, ingestItem{ss, f})
	} else {
		in.rest = append(in.rest, ingestItem{ss, f})
	}
	if !in.running {
		in.running = true
		// Counted with the sessions, so that Close waits for what is queued:
		// put runs on a session's goroutine, so the count is not zero here.
		ss.srv.wg.Add(1)
		go func() {
			defer ss.srv.wg.Done()
			in.run()
		}()
	}
	in.mu.Unlock()
}

// shift drops q's first n items in place, so that a queue's array does not grow
// without bound under a steady load.
func shift(q []ingestItem, n int) []ingestItem {
	m := copy(q, q[n:])
	clear(q[m:])
	return q[:m]
}

func (in *ingester) run() {
	var batch []ingestItem
	var order []*session
	frames := map[*session][]protocol.Frame{}
	for {
		in.mu.Lock()
		if len(in.first)+len(in.rest) == 0 {
			in.running = false
			in.mu.Unlock()
			return
		}
		nr := min(len(in.rest), ingestBatch-min(len(in.first), ingestFirst))
		nf := min(len(in.first), ingestBatch-nr)
		batch = append(batch[:0], in.first[:nf]...)
		batch = append(batch, in.rest[:nr]...)
		in.first = shift(in.first, nf)
		in.rest = shift(in.rest, nr)
		in.space.Broadcast()
		in.mu.Unlock()

		order = order[:0]
		for _, it := range batch {
			if _, ok := frames[it.ss]; !ok {
				order = append(order, it.ss)
			}
			frames[it.ss] = append(frames[it.ss], it.f)
		}
		for _, ss := range order {
			// A session that failed in an earlier round stores nothing more:
			// its agent replays everything it has no ack of.
			if ss.ctx.Err() == nil && !ss.failed.Load() {
				ss.store(frames[ss])
			}
			delete(frames, ss)
		}
		clear(batch)
	}
}
