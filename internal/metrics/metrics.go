package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where the endpoint answers.
const Path = "/metrics"

// NewRegistry is a registry holding the Go runtime's and this process's
// collectors (go_*, process_*), to which a caller adds its own.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// CheckAddr says what is wrong with a listen address: host:port with a port
// from 1 to 65535 and a host that is empty (every address), an IP address or
// a name.
func CheckAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (such as 127.0.0.1:9464)", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("%q has no valid port (1 to 65535)", addr)
	}
	if host != "" && strings.ContainsAny(host, " /\\?#@") {
		return fmt.Errorf("%q: %q is neither an IP address nor a host name", addr, host)
	}
	return nil
}

// Server serves a registry on Path over plain HTTP. Metrics carry no secret
// (no MAC, no machine name, no token), so the endpoint has no authentication:
// bind it to an address only the monitoring network reaches.
type Server struct {
	reg  *prometheus.Registry
	ln   net.Listener
	srv  *http.Server
	once sync.Once
	done chan struct{}
}

// Listen opens addr (host:port) for reg. A port already taken fails here, so
// that a daemon configured for metrics does not start without them.
func Listen(addr string, reg *prometheus.Registry, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listening on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+Path, promhttp.InstrumentMetricHandler(reg, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// One failing collector (the store unreachable) must not hide
		// the boot servers' figures: it is logged and left out.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      slogPrinter{log},
		// A scrape that queues behind a slow one is answered 503 rather
		// than pile up.
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not found: metrics are at "+Path, http.StatusNotFound)
	})
	return &Server{reg: reg, ln: ln, done: make(chan struct{}), srv: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      20 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}}, nil
}

// Registry is the registry served, for collectors made after Listen.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Addr is where the server listens.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// URL is http://Addr/metrics.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + Path }

// Serve answers until Close or ctx ends; it returns nil then.
func (s *Server) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	err := s.srv.Serve(s.ln)
	if errors.Is(err, http.ErrServerClosed) {
		<-s.done
		return nil
	}
	return fmt.Errorf("metrics: %w", err)
}

// Close stops the server: scrapes in flight get a second to finish.
func (s *Server) Close() {
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			s.srv.Close()
		}
		s.ln.Close()
		close(s.done)
	})
}

type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) { p.log.Warn("metrics: " + fmt.Sprint(v...)) }

// Cached is a collector whose metrics come from Query, run at most once per
// TTL however often Prometheus (or several) scrape: a query of the store
// must not run per scrape during a storm. A failed query reports nothing
// for its metrics (Prometheus marks them stale) and is tried again at the
// next scrape.
type Cached struct {
	// Descs are every metric Query may return.
	Descs []*prometheus.Desc
	// TTL is how long a result is kept; 0 means 5 s.
	TTL time.Duration
	// Timeout bounds one query; 0 means 5 s.
	Timeout time.Duration
	// Query returns the metrics now.
	Query func(ctx context.Context) ([]prometheus.Metric, error)
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu   sync.Mutex
	at   time.Time
	last []prometheus.Metric
}

// Describe sends Descs.
func (c *Cached) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.Descs {
		ch <- d
	}
}

// Collect sends the cached result, querying again when it is older than TTL.
func (c *Cached) Collect(ch chan<- prometheus.Metric) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	ttl, timeout := c.TTL, c.Timeout
	if ttl <= 0 {
		ttl = 5 * time.Second
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil || now().Sub(c.at) >= ttl {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		ms, err := c.Query(ctx)
		cancel()
		if err != nil {
			c.last = nil
			for _, d := range c.Descs {
				ch <- prometheus.NewInvalidMetric(d, err)
			}
			return
		}
		c.last, c.at = ms, now()
	}
	for _, m := range c.last {
		ch <- m
	}
}
