// Package cpmetrics is what better-compute serve exports on --metrics-listen:
// sessions by role and machines by lifecycle state (read at scrape time, the
// machines from one store query cached a few seconds), joins by attestor and
// code, agents' events by kind, and deployments (duration by outcome, image
// bytes and write time). The domain packages know nothing of Prometheus: they
// expose a count (gateway.Server.SessionsByRole, store's CountMachinesByState)
// or an observer (lifecycle.DeployObserver), or are wrapped at their edge
// (the gateway's Joiner and EventHandler).
package cpmetrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/bcd/controlplane/gateway"
	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/lifecycle"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/metrics"
	"github.com/better-compute/bcd/protocol"
)

// Namespace prefixes every metric of the control plane.
const Namespace = "better_compute"

// Join outcomes that are not an error code.
const (
	CodeOK           = "OK"            // the node's certificate was issued
	CodeDeferred     = "DEFERRED"      // retry_after_s: waiting for an operator's approval
	CodeTPMChallenge = "TPM_CHALLENGE" // the tpm attestor's first round
	other            = "other"
)

// Bucket bounds, in seconds.
var (
	// DeployBuckets: a deployment from `machines deploy` to provisioned (or
	// failed) takes minutes on real hardware, under an hour by its timeout.
	DeployBuckets = []float64{10, 30, 60, 120, 300, 600, 900, 1200, 1800, 2700, 3600, 7200}
	// ImageBuckets: deploy.image's own write time.
	ImageBuckets = []float64{1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600}
)

// The label values the metrics accept from agents' requests, so that a
// client cannot grow a series per value it sends.
var (
	attestors = []string{protocol.AttestorJoinToken, protocol.AttestorDiscovery, protocol.AttestorTPM, protocol.AttestorProvisioned}
	roles     = []string{protocol.RoleSite, protocol.RoleRamdisk, protocol.RoleNode}
	events    = []string{protocol.EventMachineBooted, protocol.EventBootNonce, protocol.EventBootRefused, protocol.EventLog, protocol.EventSectionStatus}
	// States are the lifecycle's, each exported even at 0.
	states = []string{store.MachineRegistered, store.MachinePXEBooting, store.MachineRamdisk, store.MachineDeploying,
		store.MachineInstalling, store.MachineProvisioned, store.MachineFailed}
	outcomes = []string{lifecycle.OutcomeProvisioned, lifecycle.OutcomeFailed, lifecycle.OutcomeCancelled}
)

func known(v string, set []string) string {
	for _, s := range set {
		if v == s {
			return v
		}
	}
	return other
}

// Gateway is what the metrics read from the gateway at scrape time:
// gateway.Server's counts.
type Gateway interface {
	// SessionsByRole is the sessions open, by role.
	SessionsByRole() map[string]int
	// JoinRefusals is the joins refused since start, malformed ones included.
	JoinRefusals() uint64
}

// MachineCounter is the store's count of machines by state.
type MachineCounter interface {
	CountMachinesByState(ctx context.Context) (map[string]int, error)
}

// Metrics are the control plane's. Register Collectors, wrap the gateway's
// Joiner and Events, and set the lifecycle's Metrics to it.
type Metrics struct {
	joins       *prometheus.CounterVec
	events      *prometheus.CounterVec
	deploy      *prometheus.HistogramVec
	imageBytes  prometheus.Counter
	imageWrites prometheus.Histogram

	gw       Gateway
	machines MachineCounter
}

// New makes the metrics of gw (a *gateway.Server) and machines (the store).
func New(gw Gateway, machines MachineCounter) *Metrics {
	m := &Metrics{
		gw:       gw,
		machines: machines,
		joins: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "joins_total",
			Help: "Joins answered, by attestor and outcome code: OK, DEFERRED, TPM_CHALLENGE, or the refusal's code (NONCE_UNKNOWN, TOKEN_INVALID, ...)."},
			[]string{"attestor", "code"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "agent_events_total",
			Help: "Events from agents' sessions the control plane recorded, by kind (machine.booted, boot.nonce, log, section.status, other)."},
			[]string{"kind"}),
		deploy: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "deploy_duration_seconds",
			Help:    "Deployments from `machines deploy` to their end, by outcome (provisioned, failed, cancelled); the count is the deployments ended.",
			Buckets: DeployBuckets}, []string{"outcome"}),
		imageBytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "deploy_image_bytes_total",
			Help: "Bytes written to disks by deploy.image commands that succeeded."}),
		imageWrites: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: "deploy_image_duration_seconds",
			Help: "How long each successful deploy.image took to stream and write its image, as the ramdisk measured it.", Buckets: ImageBuckets}),
	}
	for _, o := range outcomes {
		m.deploy.WithLabelValues(o)
	}
	return m
}

// Collectors are every collector to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	sessions := prometheus.NewDesc(Namespace+"_sessions", "Agents' sessions open on this gateway, by the role of their node (site, ramdisk, node).", []string{"role"}, nil)
	machines := prometheus.NewDesc(Namespace+"_machines", "Machines by lifecycle state (registered, pxe-booting, ramdisk, deploying, installing, provisioned, failed), from the store, at most 5 s old.", []string{"state"}, nil)
	return []prometheus.Collector{
		m.joins, m.events, m.deploy, m.imageBytes, m.imageWrites,
		sessionCollector{desc: sessions, count: m.gw.SessionsByRole},
		// Read from the gateway, which counts what joins_total cannot see: a
		// request refused before it reached the Joiner (malformed, too large).
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: "join_refusals_total",
			Help: "Joins the gateway refused, malformed requests included (the gateway logs at most one \"join refused\" line a second; joins_total has the Joiner's refusals by attestor and code)."},
			func() float64 { return float64(m.gw.JoinRefusals()) }),
		&metrics.Cached{
			Descs: []*prometheus.Desc{machines},
			TTL:   5 * time.Second,
			Query: func(ctx context.Context) ([]prometheus.Metric, error) {
				n, err := m.machines.CountMachinesByState(ctx)
				if err != nil {
					return nil, err
				}
				out := make([]prometheus.Metric, 0, len(states)+1)
				rest := 0
				for s, c := range n {
					if known(s, states) == other {
						rest += c
					}
				}
				for _, s := range states {
					out = append(out, prometheus.MustNewConstMetric(machines, prometheus.GaugeValue, float64(n[s]), s))
				}
				if rest > 0 {
					out = append(out, prometheus.MustNewConstMetric(machines, prometheus.GaugeValue, float64(rest), other))
				}
				return out, nil
			},
		},
	}
}

type sessionCollector struct {
	desc  *prometheus.Desc
	count func() map[string]int
}

func (c sessionCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c sessionCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.count()
	for _, r := range roles {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n[r]), r)
	}
}

// Joiner counts the outcome of every join next answers.
func (m *Metrics) Joiner(next gateway.Joiner) gateway.Joiner { return joiner{m, next} }

type joiner struct {
	m    *Metrics
	next gateway.Joiner
}

func (j joiner) Join(ctx context.Context, req *protocol.JoinRequest) (*protocol.JoinResponse, error) {
	resp, err := j.next.Join(ctx, req)
	code := CodeOK
	switch {
	case err != nil:
		// What the gateway answers: an unclassified error is UNAVAILABLE.
		code = protocol.CodeUnavailable
		if e := httpjson.Response(err); e != nil {
			code = e.Code
		}
	case resp.TPMChallenge != nil:
		code = CodeTPMChallenge
	case resp.Signed == "" && resp.RetryAfterS > 0:
		code = CodeDeferred
	}
	j.m.joins.WithLabelValues(known(req.Attestor, attestors), code).Inc()
	return resp, err
}

// Events counts every event next records.
func (m *Metrics) Events(next gateway.EventHandler) gateway.EventHandler {
	return eventHandler{m, next}
}

type eventHandler struct {
	m    *Metrics
	next gateway.EventHandler
}

func (h eventHandler) Event(ctx context.Context, node store.Node, ev protocol.Event) (protocol.Event, error) {
	out, err := h.next.Event(ctx, node, ev)
	if err == nil {
		h.m.events.WithLabelValues(known(ev.Kind, events)).Inc()
	}
	return out, err
}

func (h eventHandler) Events(ctx context.Context, node store.Node, evs []protocol.Event) ([]protocol.Event, error) {
	out, err := h.next.Events(ctx, node, evs)
	if err == nil {
		for _, ev := range evs {
			h.m.events.WithLabelValues(known(ev.Kind, events)).Inc()
		}
	}
	return out, err
}

var _ lifecycle.DeployObserver = (*Metrics)(nil)

// DeploymentFinished is lifecycle.DeployObserver's.
func (m *Metrics) DeploymentFinished(outcome string, took time.Duration) {
	m.deploy.WithLabelValues(known(outcome, outcomes)).Observe(took.Seconds())
}

// ImageWritten is lifecycle.DeployObserver's.
func (m *Metrics) ImageWritten(bytes int64, took time.Duration) {
	if bytes > 0 {
		m.imageBytes.Add(float64(bytes))
	}
	m.imageWrites.Observe(took.Seconds())
}
