package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
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

// TestDeployOverAConnectionServeCloses: serve resets the connection of a deploy
// once (a restart), after applying it or before; the resent deploy is refused
// ALREADY_EXISTS when the lost one was applied, and that refusal is success when
// it names the machine's current deployment, of this image, made during the call.
// Any other refusal stays a failure.
func TestDeployOverAConnectionServeCloses(t *testing.T) {
	d := apiDeploy{Image: apiImage{URL: "http://10.0.0.1/image.raw", SHA256: strings.Repeat("ab", 32), Size: 8 << 20, Format: "raw"}, After: "kexec"}
	type deployment struct {
		ID      string    `json:"id"`
		Spec    apiDeploy `json:"spec"`
		Created time.Time `json:"created_at"`
	}
	for _, tc := range []struct {
		name string
		// reset: the first deploy's connection is reset, after the deploy was
		// applied (applyFirst) or before.
		reset, applyFirst bool
		// existing is a deployment the machine had before the call.
		existing *deployment
		wantErr  string
	}{
		{name: "applied, then the connection reset", reset: true, applyFirst: true},
		{name: "reset before it was applied", reset: true},
		{name: "no reset: another's deployment runs", existing: &deployment{ID: "dep_old", Spec: d, Created: time.Now()},
			wantErr: "409"},
		{name: "reset: the deployment running installs another image", reset: true,
			existing: &deployment{ID: "dep_old", Spec: apiDeploy{Image: apiImage{SHA256: strings.Repeat("cd", 32), Size: 1}, After: "kexec"}, Created: time.Now()},
			wantErr:  "installs another image"},
		{name: "reset: the deployment running is older than the call", reset: true,
			existing: &deployment{ID: "dep_old", Spec: d, Created: time.Now().Add(-time.Hour)},
			wantErr:  "before this call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			cur := tc.existing
			deploys, resets := 0, 0
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case r.Method == http.MethodGet && r.URL.Path == "/api/v1/machines/m1":
					json.NewEncoder(w).Encode(map[string]any{"id": "mch_1", "current_deployment": cur})
				case r.Method == http.MethodPost && r.URL.Path == "/api/v1/machines/m1/deploy":
					deploys++
					var in apiDeploy
					if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
						http.Error(w, err.Error(), http.StatusBadRequest)
						return
					}
					if tc.reset && resets == 0 {
						resets++
						if tc.applyFirst {
							cur = &deployment{ID: "dep_1", Spec: in, Created: time.Now()}
						}
						// RST, no answer: serve killed mid-call.
						c, _, err := w.(http.Hijacker).Hijack()
						if err != nil {
							t.Error(err)
							return
						}
						c.(*net.TCPConn).SetLinger(0)
						c.Close()
						return
					}
					if cur != nil {
						w.WriteHeader(http.StatusConflict)
						fmt.Fprintf(w, `{"code":"ALREADY_EXISTS","message":"machine mch_1 is pxe-booting with deployment %s: wait for it, or stop it first (better-compute machines cancel mch_1)"}`, cur.ID)
						return
					}
					cur = &deployment{ID: "dep_2", Spec: in, Created: time.Now()}
					w.WriteHeader(http.StatusCreated)
					w.Write([]byte(`{}`))
				default:
					http.NotFound(w, r)
				}
			}))
			defer srv.Close()
			o := &operator{base: srv.URL + "/api/v1", hc: &http.Client{Timeout: 5 * time.Second}}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := o.deploy(ctx, "m1", d)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("deploy = %v, want success", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("deploy = %v, want an error with %q", err, tc.wantErr)
			}
			if want := 1 + resets; deploys != want {
				t.Errorf("%d deploy calls reached serve, want %d", deploys, want)
			}
		})
	}
}

// TestRegisterReplacesABusyLeftover: a machine left by an earlier run that did
// not settle still has its deployment running, and serve refuses its delete
// MACHINE_BUSY; registration cancels that deployment, deletes the machine and
// adds it anew (the faults run after a storm that left machines stuck). The
// deployment may also end by itself between the refusal and the cancel, which
// serve then refuses as already ended: the delete is tried again (a faults run
// failed this way).
func TestRegisterReplacesABusyLeftover(t *testing.T) {
	for _, endedMeanwhile := range []bool{false, true} {
		t.Run(fmt.Sprintf("ended meanwhile %v", endedMeanwhile), func(t *testing.T) { registerBusyLeftover(t, endedMeanwhile) })
	}
}

func registerBusyLeftover(t *testing.T, endedMeanwhile bool) {
	var mu sync.Mutex
	exists, busy := true, true
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, r.Method+" "+r.URL.Path)
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/machines":
			if exists {
				w.WriteHeader(http.StatusConflict)
				w.Write([]byte(`{"code":"ALREADY_EXISTS","message":"MAC 02:bc:51:00:00:00 is machine m_1's"}`))
				return
			}
			exists = true
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{}`))
		case r.Method == http.MethodDelete && strings.HasPrefix(r.URL.Path, "/api/v1/machines/"):
			switch {
			case !exists:
				http.Error(w, `{"code":"NOT_FOUND","message":"no such machine"}`, http.StatusNotFound)
			case busy:
				w.WriteHeader(http.StatusConflict)
				w.Write([]byte(`{"code":"MACHINE_BUSY","message":"machine m_1 is pxe-booting (dep_1): cancel it first (better-compute machines cancel m_1)"}`))
			default:
				exists = false
				w.Write([]byte(`{}`))
			}
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/cancel"):
			busy = false
			if endedMeanwhile {
				w.WriteHeader(http.StatusBadRequest)
				w.Write([]byte(`{"code":"INVALID_INPUT","message":"machine m_1's deployment dep_1 already ended (failed; state failed)"}`))
				return
			}
			w.Write([]byte(`{}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	o := &operator{base: srv.URL + "/api/v1", hc: &http.Client{Timeout: 5 * time.Second}}
	f := &fleet{cfg: Config{Site: "simlab", Parallel: 1, BMCAddr: netip.MustParseAddr("10.77.0.3"), BMCPort: 16000}, op: o,
		machines: []*machine{{name: "faults-00000", mac: net.HardwareAddr{2, 0xbc, 0x51, 0, 0, 0}, fw: FirmwareBIOS, password: "pw"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.register(ctx); err != nil {
		t.Fatalf("register = %v, want the leftover cancelled, deleted and the machine added\ncalls: %v", err, calls)
	}
	mu.Lock()
	defer mu.Unlock()
	if !exists || busy {
		t.Errorf("after register: exists %v, busy %v; calls %v", exists, busy, calls)
	}
}
