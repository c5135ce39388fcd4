package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// load is one measurement, as the coordinator hands it to the client process on
// its standard input.
type load struct {
	Proto    string        `json:"proto"` // "dhcp", "tftp" or "http"
	Warmup   time.Duration `json:"warmup"`
	Duration time.Duration `json:"duration"`

	// DHCP.
	Iface    string   `json:"iface,omitempty"`    // the client's veth towards the server
	Server   string   `json:"server,omitempty"`   // the server's IPv4 address
	ClientIP string   `json:"clientIP,omitempty"` // the address on Iface, the 4011 request's ciaddr
	Exchange bool     `json:"exchange,omitempty"` // DISCOVER→OFFER then REQUEST→ACK on 4011, not the OFFER alone
	Inflight int      `json:"inflight,omitempty"`
	MACs     int      `json:"macs,omitempty"` // benchMAC(0…MACs-1), in turn
	Firmware firmware `json:"firmware,omitempty"`

	// TFTP: Addr and File, Clients at BlockSize each.
	Addr      string `json:"addr,omitempty"`
	File      string `json:"file,omitempty"`
	FileSize  int64  `json:"fileSize,omitempty"`
	BlockSize int    `json:"blockSize,omitempty"`
	Clients   int    `json:"clients,omitempty"`

	// HTTP: Clients each fetch every URL in turn, over keep-alive connections.
	URLs []string `json:"urls,omitempty"`
}

// result is what one measurement saw inside its window.
type result struct {
	Seconds float64 `json:"seconds"`
	Ops     int64   `json:"ops"`   // DHCP answers (or exchanges), TFTP transfers, HTTP boots completed
	Bytes   int64   `json:"bytes"` // TFTP and HTTP payload received
	P50     float64 `json:"p50_ms,omitempty"`
	P99     float64 `json:"p99_ms,omitempty"`
	// Retries counts DHCP requests sent again after the answer did not come.
	Retries int64 `json:"retries"`
	// Unusable counts DHCP answers a PXE ROM would ignore (no siaddr, nothing to boot).
	Unusable int64 `json:"unusable"`
	// Errors counts failed TFTP transfers and HTTP requests (ErrorSample is one).
	Errors int64 `json:"errors"`
	// Refused counts TFTP requests the server answered with an ERROR packet
	// ("server busy" and the like): firmware aborts its boot on one.
	Refused int64 `json:"refused"`
	// Requests counts the TFTP read requests the clients made (each RRQ with
	// its retransmissions), over the whole run.
	Requests    int64  `json:"requests,omitempty"`
	ErrorSample string `json:"error_sample,omitempty"`

	// AllOps and AllBytes count the whole client run, warm-up and the transfers
	// finishing after the window included: the server's CPU time is measured over
	// all of it.
	AllOps   int64 `json:"all_ops"`
	AllBytes int64 `json:"all_bytes"`
	// ServerCPU is the user and system time the server spent during the client
	// run, filled in by the coordinator; ServeCPU better-compute serve's, for
	// bcd site (the events it reports).
	ServerCPU time.Duration `json:"server_cpu,omitempty"`
	ServeCPU  time.Duration `json:"serve_cpu,omitempty"`
}

// CPUPerOp is the server's CPU time per answer or exchange, in µs.
func (r result) CPUPerOp() float64 {
	if r.AllOps == 0 {
		return 0
	}
	return float64(r.ServerCPU) / float64(time.Microsecond) / float64(r.AllOps)
}

// ServePerOp is serve's CPU time per answer or exchange of bcd site, in µs.
func (r result) ServePerOp() float64 {
	if r.AllOps == 0 {
		return 0
	}
	return float64(r.ServeCPU) / float64(time.Microsecond) / float64(r.AllOps)
}

// CPUPerMiB is the server's CPU time per MiB received, in ms.
func (r result) CPUPerMiB() float64 {
	if r.AllBytes == 0 {
		return 0
	}
	return float64(r.ServerCPU) / float64(time.Millisecond) / (float64(r.AllBytes) / (1 << 20))
}

// Rate is operations per second.
func (r result) Rate() float64 { return float64(r.Ops) / r.Seconds }

// MiBps is payload throughput in MiB/s.
func (r result) MiBps() float64 { return float64(r.Bytes) / (1 << 20) / r.Seconds }

// runClient is the client process: it reads a load, generates it, and writes the
// result as JSON.
func runClient(stdin io.Reader, stdout io.Writer) error {
	var l load
	if err := json.NewDecoder(stdin).Decode(&l); err != nil {
		return fmt.Errorf("client: reading the load: %w", err)
	}
	if l.Duration <= 0 || l.Warmup < 0 {
		return errors.New("client: the load has no duration")
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.Warmup+l.Duration+2*time.Minute)
	defer cancel()
	var (
		r   result
		err error
	)
	switch l.Proto {
	case "dhcp":
		r, err = dhcpLoad(ctx, l)
	case "tftp":
		r, err = tftpLoad(ctx, l)
	case "http":
		r, err = httpLoad(ctx, l)
	default:
		err = fmt.Errorf("client: unknown protocol %q", l.Proto)
	}
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(r)
}

// window runs the load's warm-up, then its measured window, reading counters at
// both ends: what completes during the warm-up (connections opening, caches
// filling) is not measured.
type window struct {
	open    atomic.Bool // inside the measured window
	stopped atomic.Bool // the workers should stop
}

// measure waits out the warm-up, snapshots with read, opens the window for
// l.Duration, snapshots again, and stops the workers. It returns the window's
// length and the two snapshots.
func (w *window) measure(ctx context.Context, l load, read func() int64) (secs float64, before, after int64, err error) {
	defer w.stopped.Store(true)
	select {
	case <-time.After(l.Warmup):
	case <-ctx.Done():
		return 0, 0, 0, ctx.Err()
	}
	before = read()
	start := time.Now()
	w.open.Store(true)
	select {
	case <-time.After(l.Duration):
	case <-ctx.Done():
		return 0, 0, 0, ctx.Err()
	}
	w.open.Store(false)
	after = read()
	return time.Since(start).Seconds(), before, after, nil
}

// errorLog counts errors and keeps the first.
type errorLog struct {
	n     atomic.Int64
	mu    sync.Mutex
	first string
}

func (e *errorLog) add(err error) {
	if e.n.Add(1) == 1 {
		e.mu.Lock()
		e.first = err.Error()
		e.mu.Unlock()
	}
}

func (e *errorLog) sample() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.first
}

// percentile returns the p-th percentile (0–100) of sorted durations, in ms.
func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)-1) * p / 100)
	return float64(sorted[i]) / float64(time.Millisecond)
}

func sortedDurations(parts [][]time.Duration) []time.Duration {
	var all []time.Duration
	for _, p := range parts {
		all = append(all, p...)
	}
	slices.Sort(all)
	return all
}
