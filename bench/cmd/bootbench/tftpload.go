package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pin/tftp/v3"
)

// tftpLoad runs l.Clients TFTP clients (pin/tftp/v3, as a Go client would fetch an
// iPXE binary), each downloading l.File again and again at l.BlockSize with
// tsize, as iPXE asks. Throughput counts the blocks that arrive inside the window,
// whether or not their transfer ends in it.
func tftpLoad(ctx context.Context, l load) (result, error) {
	if l.Clients < 1 || l.FileSize <= 0 {
		return result{}, fmt.Errorf("tftp load: clients %d, file size %d", l.Clients, l.FileSize)
	}
	var w window
	var got, transfers, all atomic.Int64
	var errs errorLog
	var refused, requests atomic.Int64
	var workers sync.WaitGroup
	for range l.Clients {
		workers.Go(func() {
			c, err := tftp.NewClient(l.Addr)
			if err != nil {
				errs.add(err)
				return
			}
			c.SetTimeout(time.Second)
			c.SetRetries(5)
			// Ask again at once on a timeout; the library's default adds up to a
			// second at random.
			c.SetBackoff(func(int) time.Duration { return 0 })
			if l.BlockSize != 512 {
				c.SetBlockSize(l.BlockSize)
			}
			c.RequestTSize(true)
			sink := &countingWriter{n: &got}
			for !w.stopped.Load() {
				requests.Add(1)
				wt, err := c.Receive(l.File, "octet")
				if err != nil {
					// pin/tftp reports an ERROR packet as "code: N, message: …".
					if strings.HasPrefix(err.Error(), "code: ") {
						refused.Add(1)
					}
					errs.add(err)
					time.Sleep(10 * time.Millisecond)
					continue
				}
				n, err := wt.WriteTo(sink)
				all.Add(1)
				switch {
				case err != nil:
					errs.add(err)
				case n != l.FileSize:
					errs.add(fmt.Errorf("transfer of %d bytes, want %d", n, l.FileSize))
				case w.open.Load():
					transfers.Add(1)
				}
			}
		})
	}
	secs, before, after, err := w.measure(ctx, l, got.Load)
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	// Transfers running at the end of the window may finish for a second (their
	// bytes count towards the CPU figure); pin/tftp's clients cannot be
	// interrupted, so the rest are left behind when this process exits: at 256
	// clients, waiting for every file would add seconds to each measurement.
	select {
	case <-done:
	case <-time.After(time.Second):
	case <-ctx.Done():
	}
	if err != nil {
		return result{}, err
	}
	return result{
		Seconds:     secs,
		Ops:         transfers.Load(),
		Bytes:       after - before,
		Errors:      errs.n.Load(),
		Refused:     refused.Load(),
		Requests:    requests.Load(),
		ErrorSample: errs.sample(),
		AllOps:      all.Load(),
		AllBytes:    got.Load(),
	}, nil
}

// countingWriter discards what it is given and adds its length to n.
type countingWriter struct{ n *atomic.Int64 }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n.Add(int64(len(p)))
	return len(p), nil
}
