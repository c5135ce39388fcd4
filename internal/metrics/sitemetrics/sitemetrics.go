// Package sitemetrics is what bcd site exports on its [metrics] endpoint: the
// boot servers' and the event reporter's counters, read from their Stats at
// scrape time, and the latency and failures of the BMC operations it runs.
package sitemetrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/bcd/site"
)

// Namespace prefixes every metric of the site agent.
const Namespace = "bcd_site"

// BMCBuckets are the BMC latency histogram's upper bounds, in seconds: an IPMI
// command answers in tens of milliseconds on a healthy BMC, a power cycle
// through a busy plugin in seconds, an unreachable BMC at its timeout.
var BMCBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Collector exports one Site.
type Collector struct {
	site *site.Site

	dhcpReceived, dhcpMalformed, dhcpIgnored, dhcpAnswers, dhcpSendErrors, dhcpReadErrors *prometheus.Desc

	tftpTransfers, tftpBytes, tftpErrors, tftpWaits, tftpFailed, tftpInvalid, tftpRepeats, tftpRetransmits *prometheus.Desc

	httpRequests, httpBytes, httpResponses, httpStalled, httpTooSlow, httpConns, httpOpen *prometheus.Desc

	eventsJournaled, eventsCoalesced, eventsDropped, eventsNoMAC *prometheus.Desc

	witnessRefused, witnessLimited, witnessSigned *prometheus.Desc

	bmcDuration *prometheus.HistogramVec
	bmcFailures *prometheus.CounterVec
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(Namespace+"_"+name, help, labels, nil)
}

// New is a Collector for s, which it hooks for the BMC operations
// (s.BMCObserver): call it before s.Run.
func New(s *site.Site) *Collector {
	c := &Collector{
		site:           s,
		dhcpReceived:   desc("dhcp_packets_received_total", "Packets the proxyDHCP read on ports 67 and 4011."),
		dhcpMalformed:  desc("dhcp_malformed_total", "Packets dropped as not DHCP, or with a PXE option of the wrong length."),
		dhcpIgnored:    desc("dhcp_ignored_total", "Packets not for this proxyDHCP, by reason: not-pxe, no-entry (the MAC has no boot entry), no-binary, request-on-67 (the site DHCP server's), other.", "reason"),
		dhcpAnswers:    desc("dhcp_answers_total", "Answers sent, by kind: offer (port 67) or ack (port 4011).", "kind"),
		dhcpSendErrors: desc("dhcp_send_errors_total", "Answers the kernel refused to send."),
		dhcpReadErrors: desc("dhcp_read_errors_total", "Failed reads other than the socket closing."),

		tftpTransfers:   desc("tftp_transfers_total", "Files sent whole over TFTP."),
		tftpBytes:       desc("tftp_bytes_total", "Bytes of the files sent whole over TFTP."),
		tftpErrors:      desc("tftp_errors_total", "TFTP error packets sent in answer to a request, by RFC 1350 code: 1 file not found, 2 access violation (outside the root, a write, too large). Capacity never answers an error (see tftp_waits_total).", "code"),
		tftpWaits:       desc("tftp_waits_total", "Requests left unanswered because every transfer slot was busy: the client retransmits and is answered once one ends."),
		tftpFailed:      desc("tftp_failed_total", "Transfers abandoned: the client stopped acknowledging, went away or sent an error."),
		tftpInvalid:     desc("tftp_invalid_packets_total", "Datagrams at the TFTP port that start nothing: unparsable, or not a request."),
		tftpRepeats:     desc("tftp_repeats_total", "Requests dropped because the same client port has a transfer under way (a firmware retransmitting its RRQ)."),
		tftpRetransmits: desc("tftp_retransmits_total", "Blocks sent again in completed transfers, after a timeout or a windowsize client's gap."),

		httpRequests:  desc("http_requests_total", "Boot HTTP requests by route: script (/ipxe/{mac}.ipxe), kernel, initrd, binary (/ipxe/{binary}), other.", "route"),
		httpBytes:     desc("http_bytes_total", "Body bytes the boot HTTP server sent, by route.", "route"),
		httpResponses: desc("http_responses_total", "Boot HTTP responses by status class (2xx, 3xx, 4xx, 5xx).", "class"),
		httpStalled:   desc("http_stalled_total", "Boot HTTP responses cut because the client took nothing for the stall timeout."),
		httpTooSlow:   desc("http_too_slow_total", "File downloads cut at their upper bound (stall timeout + size at the minimum rate)."),
		httpConns:     desc("http_connections_total", "Connections the boot HTTP server accepted."),
		httpOpen:      desc("http_connections_open", "Connections the boot HTTP server holds open now."),

		eventsJournaled: desc("events_journaled_total", "machine.booted events handed to the journal, to be sent to the control plane."),
		eventsCoalesced: desc("events_coalesced_total", "Serves folded into another machine.booted event's count (the same MAC and stage within the event interval) instead of an event of their own."),
		eventsDropped:   desc("events_dropped_total", "Serves whose machine.booted event was lost: the journal refused it, or the tracking table overflowed."),
		eventsNoMAC:     desc("events_no_mac_total", "Serves to a client address no MAC is known for: no event."),

		witnessRefused: desc("boot_witness_refused_total", "Boot nonces and join witnesses refused: the neighbour table has another MAC, or none, for the client (spoofing?)."),
		witnessLimited: desc("boot_nonce_rate_limited_total", "Boot nonces refused because the MAC or the client address asked too often."),
		witnessSigned:  desc("boot_witness_signed_total", "Ramdisk joins the site agent countersigned."),

		bmcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "bmc_operation_duration_seconds",
			Help:    "How long each BMC operation took through its driver (the bcx-ipmi plugin), failed ones included, by op.",
			Buckets: BMCBuckets,
		}, []string{"op"}),
		bmcFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "bmc_operation_failures_total",
			Help: "BMC operations that FAILED, by op and by the reason of their status (bmc-unreachable, bmc-auth, plugin-failed, ...).",
		}, []string{"op", "reason"}),
	}
	// Every op at 0 from the start, so a rate() has a series before the
	// first failure.
	for _, op := range site.BMCOps {
		c.bmcDuration.WithLabelValues(op)
	}
	s.BMCObserver = c.observeBMC
	return c
}

func (c *Collector) observeBMC(op, reason string, took time.Duration) {
	c.bmcDuration.WithLabelValues(op).Observe(took.Seconds())
	if reason != "" {
		c.bmcFailures.WithLabelValues(op, reason).Inc()
	}
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.dhcpReceived, c.dhcpMalformed, c.dhcpIgnored, c.dhcpAnswers, c.dhcpSendErrors, c.dhcpReadErrors,
		c.tftpTransfers, c.tftpBytes, c.tftpErrors, c.tftpWaits, c.tftpFailed, c.tftpInvalid, c.tftpRepeats, c.tftpRetransmits,
		c.httpRequests, c.httpBytes, c.httpResponses, c.httpStalled, c.httpTooSlow, c.httpConns, c.httpOpen,
		c.eventsJournaled, c.eventsCoalesced, c.eventsDropped, c.eventsNoMAC,
		c.witnessRefused, c.witnessLimited, c.witnessSigned,
	} {
		ch <- d
	}
	c.bmcDuration.Describe(ch)
	c.bmcFailures.Describe(ch)
}

// Collect reads the servers' counters now. A server that does not run
// exports nothing, rather than zeros that would look like an idle one.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	if st, ok := c.site.DHCPStats(); ok {
		counter(c.dhcpReceived, st.Received)
		counter(c.dhcpMalformed, st.Malformed)
		for reason, n := range st.IgnoredByReason {
			counter(c.dhcpIgnored, n, reason)
		}
		counter(c.dhcpAnswers, st.Offers, "offer")
		counter(c.dhcpAnswers, st.Acks, "ack")
		counter(c.dhcpSendErrors, st.SendErrors)
		counter(c.dhcpReadErrors, st.ReadErrors)
	}
	if st, ok := c.site.TFTPStats(); ok {
		counter(c.tftpTransfers, st.Transfers)
		counter(c.tftpBytes, st.Bytes)
		counter(c.tftpErrors, st.NotFound, "1")
		counter(c.tftpErrors, st.Refused, "2")
		counter(c.tftpWaits, st.Waits)
		counter(c.tftpFailed, st.Failed)
		counter(c.tftpInvalid, st.Errors)
		counter(c.tftpRepeats, st.Repeats)
		counter(c.tftpRetransmits, st.Retransmits)
	}
	if st, ok := c.site.HTTPStats(); ok {
		for route, r := range st.ByRoute() {
			counter(c.httpRequests, r.Requests, route)
			counter(c.httpBytes, r.Bytes, route)
		}
		for class := 2; class < len(st.Status); class++ {
			counter(c.httpResponses, st.Status[class], strconv.Itoa(class)+"xx")
		}
		counter(c.httpStalled, st.Stalled)
		counter(c.httpTooSlow, st.TooSlow)
		counter(c.httpConns, st.Connections)
		ch <- prometheus.MustNewConstMetric(c.httpOpen, prometheus.GaugeValue, float64(st.Open))
	}
	ev := c.site.EventStats()
	counter(c.eventsJournaled, ev.Journaled)
	counter(c.eventsCoalesced, ev.Coalesced)
	counter(c.eventsDropped, ev.Dropped)
	counter(c.eventsNoMAC, ev.NoMAC)
	if st, ok := c.site.WitnessStats(); ok {
		counter(c.witnessRefused, st.Refused)
		counter(c.witnessLimited, st.RateLimited)
		counter(c.witnessSigned, st.Witnessed)
	}
	c.bmcDuration.Collect(ch)
	c.bmcFailures.Collect(ch)
}
