package controlplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// BenchmarkJoin measures joins per second: POST /v1/join over loopback TLS
// (keep-alive, one connection per worker) through the whole JoinService:
// open the sealed token, check the CSR, issue the certificate, consume the
// token and write the node in one transaction, sign the answer.
func BenchmarkJoin(b *testing.B) {
	s, _ := startServer(b, newPKI(b), filepath.Join(b.TempDir(), "data"), nil)
	if err := s.Store().CreateSite(ctx, store.Site{Name: cptest.Site, CreatedAt: time.Now()}); err != nil {
		b.Fatal(err)
	}
	reqs := make([][]byte, b.N)
	for i := range reqs {
		_, tok := cptest.NewToken(b, s.Store(), nil)
		req := cptest.NewAgent(b).Request(b, s.Bundle(), "node", tok, func(r *protocol.JoinRequest) { r.Claims.SystemUUID = "" })
		reqs[i], _ = json.Marshal(req)
	}
	var next atomic.Int64
	hc := gatewayClient(s, nil)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body := reqs[next.Add(1)-1]
			resp, err := hc.Post(s.AdvertisedGatewayURL()+protocol.PathJoin, "application/json", strings.NewReader(string(body)))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("join: HTTP %d", resp.StatusCode)
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "joins/s")
}

// TestSessions100 holds 100 concurrent sessions and reports the gateway's
// memory per session; BenchmarkSessions1000 does the same with 1,000
// (go test -run '^$' -bench Sessions1000 ./controlplane/).
func TestSessions100(t *testing.T) {
	perSession, goroutines := holdSessions(t, 100)
	if perSession > 256<<10 {
		t.Errorf("%.0f bytes per session: more than 256 KiB", perSession)
	}
	if goroutines > 2.5 {
		t.Errorf("%.1f goroutines per session, want 2 (reader and writer)", goroutines)
	}
}

func BenchmarkSessions1000(b *testing.B) {
	perSession, goroutines := holdSessions(b, 1000)
	b.ReportMetric(perSession, "bytes/session")
	b.ReportMetric(goroutines, "goroutines/session")
}

// clientPlan is what the helper process needs to open the sessions.
type clientPlan struct {
	Gateway  string        `json:"gateway"`
	CA       string        `json:"ca"`
	Sessions []planSession `json:"sessions"`
}

type planSession struct {
	Chain  []string `json:"chain"`
	Key    string   `json:"key"`
	NodeID string   `json:"node_id"`
}

// holdSessions joins n nodes, has a helper process (this test binary)
// open a session for each, and measures this process (the control plane
// alone) before and after: heap and stack bytes, and goroutines, per
// session. BCD_MEM_DEBUG=1 prints heap and stack apart; BCD_MEM_PROFILE=F
// writes a full heap profile (and F.goroutine) once the sessions are up.
func holdSessions(tb testing.TB, n int) (bytesPerSession, goroutinesPerSession float64) {
	if os.Getenv("BCD_MEM_PROFILE") != "" {
		runtime.MemProfileRate = 1
	}
	s, _ := startServer(tb, newPKI(tb), filepath.Join(tb.TempDir(), "data"), nil)
	if err := s.Store().CreateSite(ctx, store.Site{Name: cptest.Site, CreatedAt: time.Now()}); err != nil {
		tb.Fatal(err)
	}
	plan := clientPlan{Gateway: s.AdvertisedGatewayURL(), CA: s.Bundle().Public.ServingCAPEM, Sessions: make([]planSession, n)}
	hc := gatewayClient(s, nil)
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				_, tok := cptest.NewToken(tb, s.Store(), nil)
				a := cptest.NewAgent(tb)
				jr, er := postJoin(tb, hc, s.AdvertisedGatewayURL(), a.Request(tb, s.Bundle(), "node", tok, func(r *protocol.JoinRequest) { r.Claims.SystemUUID = "" }))
				if er != nil {
					tb.Errorf("join %d: %+v", i, er)
					continue
				}
				res := a.Verify(tb, s.Bundle(), jr)
				key, _ := pki.MarshalPKCS8PEM(a.Key)
				plan.Sessions[i] = planSession{Chain: res.CertChain, Key: string(key), NodeID: res.NodeID}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if tb.Failed() {
		tb.FailNow()
	}
	hc.CloseIdleConnections()
	planFile := filepath.Join(tb.TempDir(), "plan.json")
	b, _ := json.Marshal(plan)
	if err := os.WriteFile(planFile, b, 0o600); err != nil {
		tb.Fatal(err)
	}

	before, gBefore := settle()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSessionClientHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), "BCD_TEST_SESSION_PLAN="+planFile)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	defer func() {
		stdin.Close()
		cmd.Wait()
	}()
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, "sessions ready") {
				ready <- nil
				io.Copy(io.Discard, stdout)
				return
			} else if strings.HasPrefix(line, "sessions failed") {
				ready <- fmt.Errorf("helper: %s", line)
				return
			}
		}
		ready <- fmt.Errorf("helper exited before its sessions were ready")
	}()
	select {
	case err := <-ready:
		if err != nil {
			tb.Fatal(err)
		}
	case <-time.After(5 * time.Minute):
		tb.Fatal("timed out waiting for the sessions")
	}
	deadline := time.Now().Add(time.Minute)
	for s.gw.SessionCount() != n {
		if time.Now().After(deadline) {
			tb.Fatalf("%d sessions registered, want %d", s.gw.SessionCount(), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	after, gAfter := settle()
	if f := os.Getenv("BCD_MEM_PROFILE"); f != "" {
		pf, _ := os.Create(f)
		pprof.Lookup("heap").WriteTo(pf, 0)
		pf.Close()
		gf, _ := os.Create(f + ".goroutine")
		pprof.Lookup("goroutine").WriteTo(gf, 1)
		gf.Close()
	}
	bytesPerSession = float64(after-before) / float64(n)
	goroutinesPerSession = float64(gAfter-gBefore) / float64(n)
	tb.Logf("%d sessions: %.1f KiB of heap and stack per session, %.2f goroutines per session", n, bytesPerSession/1024, goroutinesPerSession)
	return bytesPerSession, goroutinesPerSession
}

// settle collects garbage and returns the bytes in use (heap and stacks)
// and the number of goroutines.
func settle() (uint64, int) {
	var m runtime.MemStats
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
	}
	runtime.ReadMemStats(&m)
	if os.Getenv("BCD_MEM_DEBUG") != "" {
		fmt.Fprintf(os.Stderr, "heap %d stack %d\n", m.HeapInuse, m.StackInuse)
	}
	return m.HeapInuse + m.StackInuse, runtime.NumGoroutine()
}

// TestSessionClientHelper is the helper process of holdSessions: it opens
// every session of the plan, says "sessions ready", then keeps reading (so
// pings are answered) until its standard input closes. Without the plan it
// does nothing.
func TestSessionClientHelper(t *testing.T) {
	path := os.Getenv("BCD_TEST_SESSION_PLAN")
	if path == "" {
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Println("sessions failed:", err)
		return
	}
	var plan clientPlan
	if err := json.Unmarshal(b, &plan); err != nil {
		fmt.Println("sessions failed:", err)
		return
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(plan.CA))
	url := "wss" + strings.TrimPrefix(plan.Gateway, "https") + protocol.PathSession
	var failed atomic.Value
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	conns := make([]*websocket.Conn, len(plan.Sessions))
	for i, ps := range plan.Sessions {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := openSession(url, roots, ps)
			if err != nil {
				failed.Store(err.Error())
				return
			}
			conns[i] = c
		}()
	}
	wg.Wait()
	if msg := failed.Load(); msg != nil {
		fmt.Println("sessions failed:", msg)
		return
	}
	for _, c := range conns {
		go func() {
			for {
				if _, _, err := c.Read(context.Background()); err != nil {
					return
				}
			}
		}()
	}
	fmt.Println("sessions ready")
	io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.CloseNow()
	}
}

func openSession(url string, roots *x509.CertPool, ps planSession) (*websocket.Conn, error) {
	var chain [][]byte
	for _, p := range ps.Chain {
		blk, _ := pem.Decode([]byte(p))
		chain = append(chain, blk.Bytes)
	}
	key, err := pki.ParsePKCS8PEM([]byte(ps.Key))
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{{Certificate: chain, PrivateKey: key}}}}
	dctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, url, &websocket.DialOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		return nil, err
	}
	f, _ := protocol.NewFrame(protocol.FrameHello, protocol.Hello{ProtocolVersion: protocol.Version, NodeID: ps.NodeID, Role: "node", DaemonVersion: "bench", BootID: "b"})
	b, _ := json.Marshal(f)
	if err := c.Write(dctx, websocket.MessageText, b); err != nil {
		return nil, err
	}
	_, data, err := c.Read(dctx)
	if err != nil {
		return nil, err
	}
	var w protocol.Frame
	if json.Unmarshal(data, &w); w.Type != protocol.FrameWelcome {
		return nil, fmt.Errorf("got %s, want welcome", w.Type)
	}
	return c, nil
}
