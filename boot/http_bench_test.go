package boot

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkHTTPRamdisk downloads a 16 MiB kernel and a 64 MiB initrd, as iPXE does,
// with 1, 16 and 64 clients at once over keep-alive connections on loopback.
func BenchmarkHTTPRamdisk(b *testing.B) {
	h := startHTTP(b, nil)
	dir := h.srv.RamdiskDir
	for name, size := range map[string]int{"vmlinuz": 16 << 20, "initrd": 64 << 20} {
		if err := os.WriteFile(filepath.Join(dir, name), make([]byte, size), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	h.srv.Observer = nil
	const pair = 80 << 20
	for _, clients := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			tr := &http.Transport{MaxIdleConnsPerHost: clients}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			var left atomic.Int64
			left.Store(int64(b.N))
			var wg sync.WaitGroup
			b.SetBytes(pair)
			b.ResetTimer()
			start := time.Now()
			for range clients {
				wg.Go(func() {
					for left.Add(-1) >= 0 {
						for _, p := range []string{"/ramdisk/vmlinuz", "/ramdisk/initrd"} {
							resp, err := c.Get(h.base + p)
							if err != nil {
								b.Error(err)
								return
							}
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)*pair/(1<<30)/time.Since(start).Seconds(), "GiB/s")
		})
	}
}

// BenchmarkHTTPScript renders ramdisk scripts, each with a fresh nonce.
func BenchmarkHTTPScript(b *testing.B) {
	h := startHTTP(b, nil)
	h.srv.Nonces = nil
	h.srv.Observer = nil
	c := &http.Client{}
	b.ResetTimer()
	for range b.N {
		resp, err := c.Get(h.base + "/ipxe/52:54:00:12:34:56.ipxe")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
