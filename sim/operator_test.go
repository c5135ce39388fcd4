package sim

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestOperatorRetriesWhileServeIsDown: a call waits for serve to come back, over a
// refused connection and over 503s, and fails at once on any other refusal.
func TestOperatorRetriesWhileServeIsDown(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch n := calls.Add(1); {
		case r.URL.Path == "/api/v1/bad":
			http.Error(w, "no", http.StatusBadRequest)
		case n <= 2:
			http.Error(w, "restarting", http.StatusServiceUnavailable)
		default:
			w.Write([]byte(`{}`))
		}
	}))
	// The address is known before anything listens on it: the first attempts are
	// refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	o := &operator{base: "http://" + addr + "/api/v1", hc: &http.Client{Timeout: 5 * time.Second}}
	go func() {
		time.Sleep(600 * time.Millisecond)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		srv.Listener = l
		srv.Start()
	}()
	t.Cleanup(func() { srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := o.do(ctx, http.MethodGet, "/machines", nil, nil); err != nil {
		t.Fatalf("do = %v, want success once serve is back", err)
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("%d calls reached serve, want 3 (two 503s, then the answer)", n)
	}
	if err := o.do(ctx, http.MethodGet, "/bad", nil, nil); err == nil {
		t.Error("a 400 was retried into success")
	} else if ae, ok := err.(*APIError); !ok || ae.Status != 400 {
		t.Errorf("do = %v, want the 400", err)
	}
}
