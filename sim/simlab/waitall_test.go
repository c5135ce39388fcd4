package simlab

import (
	"context"
	"testing"
	"time"
)

// TestWaitAllKeepsAnEarlyEvent: a load generator that is ahead sends its
// next step's event (prepared right after joined) before another has sent
// this step's; waiting for the next step must still find it (it was dropped,
// and TestSessionBench timed out waiting for prepared).
func TestWaitAllKeepsAnEarlyEvent(t *testing.T) {
	b := &SessionBench{lgs: make([]*loadgenProc, 2), lgEv: make(chan lgEvent, 8)}
	for _, ev := range []lgEvent{
		{k: 0, e: loadgenEvent{Event: "joined", N: 1}},
		{k: 0, e: loadgenEvent{Event: "progress", N: 3}},
		{k: 0, e: loadgenEvent{Event: "prepared", N: 1}},
		{k: 1, e: loadgenEvent{Event: "joined", N: 2}},
		{k: 1, e: loadgenEvent{Event: "prepared", N: 2}},
	} {
		b.lgEv <- ev
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, want := range []string{"joined", "prepared"} {
		es, err := b.waitAll(ctx, want)
		if err != nil {
			t.Fatal(err)
		}
		for k, e := range es {
			if e.Event != want || e.N != k+1 {
				t.Errorf("%s: load generator %d gave %+v", want, k, e)
			}
		}
	}
	if len(b.early) != 0 {
		t.Errorf("left over: %+v", b.early)
	}
}
