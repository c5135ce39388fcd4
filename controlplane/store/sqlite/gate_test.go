package sqlite

import (
	"database/sql"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
)

// TestPriorityWritesGoFirst: with the write connection busy and many writers
// waiting for it, a write with priority (a site agent's session) is the next
// to get it. database/sql handed the one connection to a random waiter, and a
// site agent's session waited behind its machines' sessions at every event.
func TestPriorityWritesGoFirst(t *testing.T) {
	st, err := Open(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	s := st.(*sqliteStore)
	held, release := make(chan struct{}), make(chan struct{})
	go s.tx(ctx, func(*sql.Tx) error {
		close(held)
		<-release
		return nil
	})
	<-held
	const others = 20
	var wg sync.WaitGroup
	add := func(node string, prio bool) {
		c := ctx
		if prio {
			c = store.WithPriority(ctx)
		}
		wg.Go(func() {
			if err := s.AddEvent(c, store.Event{NodeID: node, Seq: 1, Kind: "log", Time: time.Now(), ReceivedAt: time.Now()}); err != nil {
				t.Error(err)
			}
		})
	}
	for i := range others {
		add("n_machine"+string(rune('a'+i)), false)
	}
	time.Sleep(300 * time.Millisecond) // all of them waiting
	add("n_site", true)
	time.Sleep(300 * time.Millisecond)
	close(release)
	wg.Wait()
	var first string
	if err := s.r.QueryRowContext(ctx, `SELECT node_id FROM events ORDER BY id LIMIT 1`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	if first != "n_site" {
		t.Errorf("the first write after the busy one was %s's, want the one with priority (n_site)", first)
	}
}

// TestPriorityDoesNotStarve: a stream of writes with priority lets a waiting
// write without it through after at most maxPriorityStreak of them.
func TestPriorityDoesNotStarve(t *testing.T) {
	var g writeGate
	g.acquire(ctx)
	order := make(chan string, 64)
	var wg sync.WaitGroup
	wait := func(name string, prio bool) {
		c := ctx
		if prio {
			c = store.WithPriority(ctx)
		}
		n := g.waiting()
		wg.Go(func() {
			g.acquire(c)
			order <- name
			g.release()
		})
		for g.waiting() == n {
			time.Sleep(time.Millisecond)
		}
	}
	wait("rest", false)
	for range 2 * maxPriorityStreak {
		wait("first", true)
	}
	g.release()
	wg.Wait()
	close(order)
	i := 0
	for name := range order {
		if name == "rest" {
			if i != maxPriorityStreak {
				t.Errorf("the write without priority went %d-th, want %d-th", i+1, maxPriorityStreak+1)
			}
			return
		}
		i++
	}
	t.Error("the write without priority never went")
}
