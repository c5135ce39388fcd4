package gateway

import (
	"sync"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// Bounds of an ingester.
const (
	// ingestQueue bounds the frames read and not yet stored; a reader that finds
	// its ingester's queue full waits, and its agent with it.
	ingestQueue = 4096
	// ingestBatch bounds the frames one round stores.
	ingestBatch = 256
)

// ingester stores the statuses and events its sessions read. Readers queue their
// frames; one worker takes what is queued, at least one frame, groups it by session
// and stores each session's share in order, its events in one transaction and
// acknowledged with one ack. A storm's events then cost serve a transaction and an
// ack per batch rather than per event, and a session costs no goroutine more than
// its reader and writer. One worker keeps every session's frames in the order they
// were read, and the store has one writer anyway. The worker runs while there is
// work and exits when the queue is empty.
type ingester struct {
	mu      sync.Mutex
	space   sync.Cond // signalled when the worker takes frames out
	queue   []ingestItem
	running bool
}

// ingesters are the server's two: [0] for the site agents' sessions (whose
// context has store.WithPriority), [1] for every other. Apart, so that a site
// agent's boot nonces, which every ramdisk of its site waits for to join, never
// queue behind a round of a thousand ramdisks' statuses, nor wait for room in
// their queue.
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
	for ss.ctx.Err() == nil && len(in.queue) >= ingestQueue {
		in.space.Wait()
	}
	if ss.ctx.Err() != nil || ss.failed.Load() {
		in.mu.Unlock()
		return // the session ended; the agent replays what it did not see acknowledged
	}
	in.queue = append(in.queue, ingestItem{ss, f})
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

func (in *ingester) run() {
	var batch []ingestItem
	var order []*session
	frames := map[*session][]protocol.Frame{}
	for {
		in.mu.Lock()
		if len(in.queue) == 0 {
			in.running = false
			in.mu.Unlock()
			return
		}
		n := min(len(in.queue), ingestBatch)
		batch = append(batch[:0], in.queue[:n]...)
		// Shift rather than reslice, so that the queue's array does not grow
		// without bound under a steady load.
		m := copy(in.queue, in.queue[n:])
		clear(in.queue[m:])
		in.queue = in.queue[:m]
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
