package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// httpLoad runs l.Clients clients, each fetching every URL of l.URLs in turn (a
// kernel then an initrd, as iPXE boots) over its own keep-alive connection.
// Throughput counts the bytes that arrive inside the window.
func httpLoad(ctx context.Context, l load) (result, error) {
	if l.Clients < 1 || len(l.URLs) == 0 {
		return result{}, fmt.Errorf("http load: clients %d, %d URLs", l.Clients, len(l.URLs))
	}
	tr := &http.Transport{
		Proxy:               nil, // the server is on the provisioning network, never behind a proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        l.Clients,
		MaxIdleConnsPerHost: l.Clients,
		DisableCompression:  true,
		ReadBufferSize:      64 << 10,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	var w window
	var got, boots atomic.Int64
	var errs errorLog
	var workers sync.WaitGroup
	for range l.Clients {
		workers.Go(func() {
			buf := make([]byte, 256<<10)
			sink := &countingWriter{n: &got}
			for !w.stopped.Load() {
				ok := true
				for _, u := range l.URLs {
					if err := fetch(reqCtx, client, u, sink, buf); err != nil {
						if reqCtx.Err() == nil {
							errs.add(err)
							time.Sleep(10 * time.Millisecond)
						}
						ok = false
						break
					}
				}
				if ok && w.open.Load() {
					boots.Add(1)
				}
			}
		})
	}
	secs, before, after, err := w.measure(ctx, l, got.Load)
	cancel() // downloads running at the end of the window are cut short
	workers.Wait()
	if err != nil {
		return result{}, err
	}
	return result{
		Seconds:     secs,
		Ops:         boots.Load(),
		Bytes:       after - before,
		Errors:      errs.n.Load(),
		ErrorSample: errs.sample(),
		AllBytes:    got.Load(),
	}, nil
}

func fetch(ctx context.Context, c *http.Client, url string, sink io.Writer, buf []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	n, err := io.CopyBuffer(sink, resp.Body, buf)
	if err != nil {
		return err
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return errors.New("GET " + url + ": body shorter than Content-Length")
	}
	return nil
}
