package site

import (
	"encoding/json"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/agent"
)

// StatusPath is the status socket's one route (also served at /).
const StatusPath = "/v1/status"

// Status is what the status socket answers: the session, as bcd node's, and what
// the site serves.
type Status struct {
	agent.SessionStatus

	// SpecRevision is the revision of the spec applied last (saved or received).
	SpecRevision int64 `json:"spec_revision"`
	// BootEntries counts the boot table's entries; BMCHosts the BMCs.
	BootEntries int `json:"boot_entries"`
	BMCHosts    int `json:"bmc_hosts"`
	// Listening are the servers' addresses; empty when not running.
	HTTP  string `json:"http,omitempty"`
	TFTP  string `json:"tftp,omitempty"`
	DHCP  string `json:"dhcp,omitempty"`
	PXE   string `json:"pxe,omitempty"`
	Proxy string `json:"proxy,omitempty"`
	// EventsLimited, EventsDropped and EventsUnattributed count machine.booted
	// events not sent: within the rate limit, over a full queue, or without a MAC.
	EventsLimited      uint64 `json:"events_limited"`
	EventsDropped      uint64 `json:"events_dropped"`
	EventsUnattributed uint64 `json:"events_unattributed"`
}

// listenStatus binds the status socket at path, 0600.
func listenStatus(path string) (net.Listener, error) {
	return agent.ListenStatusSocket(path, 0o600)
}

func (s *Site) statusServer() *http.Server {
	mux := http.NewServeMux()
	h := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(s.Status())
	}
	mux.HandleFunc("GET "+StatusPath, h)
	mux.HandleFunc("GET /{$}", h)
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

func addrString(a interface {
	IsValid() bool
	String() string
}) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// Status reports the site agent's state; it is what the status socket answers.
// Before Run has loaded the identity it is empty.
func (s *Site) Status() Status {
	if s.session == nil || s.events == nil || s.bmcHosts == nil {
		return Status{}
	}
	a := s.Addrs()
	return Status{
		SessionStatus:      agent.NewSessionStatus(s.renewer.Current(), s.siteName(), s.Config.GatewayURL, s.session.BootID, s.session.State()).WithRenewal(s.renewer.Status()),
		SpecRevision:       s.revision.Load(),
		BootEntries:        int(s.entries.Load()),
		BMCHosts:           len(s.bmcHosts.Machines()),
		HTTP:               addrString(a.HTTP),
		TFTP:               addrString(a.TFTP),
		DHCP:               addrString(a.DHCP),
		PXE:                addrString(a.PXE),
		Proxy:              addrString(a.Proxy),
		EventsLimited:      s.events.limited.Load(),
		EventsDropped:      s.events.dropped.Load(),
		EventsUnattributed: s.events.noMAC.Load(),
	}
}

// counters the status reports, kept beside the applied state.
type specCounters struct {
	revision atomic.Int64
	entries  atomic.Int64
}
