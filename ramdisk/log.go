package ramdisk

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/protocol"
)

// NewLogger is the ramdisk's console logger: JSON lines at level, whatever w is,
// since the console of a machine in a rack is read by a serial-over-LAN log, not a
// person at a terminal.
func NewLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// eventQueue is how many log lines wait for the session before new ones are dropped.
const eventQueue = 1024

// eventSink carries log lines to the session as events. Lines queue from the start,
// so what the ramdisk logged before it joined (modules, DHCP) reaches the control
// plane too, once there is a session to send it on.
type eventSink struct {
	ch      chan protocol.Event
	dropped atomic.Int64
	mu      sync.Mutex
	closed  bool
}

func newEventSink() *eventSink { return &eventSink{ch: make(chan protocol.Event, eventQueue)} }

func (s *eventSink) offer(ev protocol.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	select {
	case s.ch <- ev:
	default:
		s.dropped.Add(1)
	}
}

func (s *eventSink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.ch)
	}
}

// drain sends queued events with send until the sink closes or ctx ends.
func (s *eventSink) drain(ctx context.Context, send func(protocol.Event) error, console *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-s.ch:
			if !ok {
				return
			}
			if n := s.dropped.Swap(0); n > 0 {
				_ = send(protocol.Event{Kind: protocol.EventLog, Time: time.Now().UTC(), Level: "WARN",
					Message: fmt.Sprintf("%d log lines were dropped before they could be sent", n)})
			}
			if err := send(ev); err != nil {
				console.Warn("could not journal a log event", "error", err.Error())
			}
		}
	}
}

// forwardHandler writes every record to the console handler and, from Info up,
// queues it as a log event. The session's own logger must not be one of these: its
// send path logs, and a line about sending must not become another send.
type forwardHandler struct {
	next  slog.Handler
	sink  *eventSink
	attrs []slog.Attr // accumulated, names already prefixed with the groups
	group string      // "a.b." prefix for attributes added from here on
}

func newForwardHandler(next slog.Handler, sink *eventSink) *forwardHandler {
	return &forwardHandler{next: next, sink: sink}
}

func (h *forwardHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l) || l >= slog.LevelInfo
}

func (h *forwardHandler) Handle(ctx context.Context, r slog.Record) error {
	var err error
	if h.next.Enabled(ctx, r.Level) {
		err = h.next.Handle(ctx, r)
	}
	if r.Level < slog.LevelInfo {
		return err
	}
	data := map[string]any{}
	for _, a := range h.attrs {
		putAttr(data, "", a)
	}
	r.Attrs(func(a slog.Attr) bool {
		putAttr(data, h.group, a)
		return true
	})
	ev := protocol.Event{Kind: protocol.EventLog, Time: r.Time.UTC(), Level: r.Level.String(), Message: r.Message}
	if len(data) > 0 {
		if b, jerr := json.Marshal(data); jerr == nil {
			ev.Data = b
		}
	}
	h.sink.offer(ev)
	return err
}

func (h *forwardHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(as)
	c.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range as {
		a.Key = h.group + a.Key
		c.attrs = append(c.attrs, a)
	}
	return &c
}

func (h *forwardHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	c := *h
	c.next = h.next.WithGroup(name)
	c.group = h.group + name + "."
	return &c
}

// putAttr flattens a (groups become dotted keys) into m with JSON-safe values.
func putAttr(m map[string]any, prefix string, a slog.Attr) {
	v := a.Value.Resolve()
	if a.Key == "" && v.Kind() != slog.KindGroup {
		return
	}
	key := prefix + a.Key
	switch v.Kind() {
	case slog.KindGroup:
		p := prefix
		if a.Key != "" {
			p = key + "."
		}
		for _, g := range v.Group() {
			putAttr(m, p, g)
		}
	case slog.KindString:
		m[key] = v.String()
	case slog.KindInt64:
		m[key] = v.Int64()
	case slog.KindUint64:
		m[key] = v.Uint64()
	case slog.KindFloat64:
		m[key] = v.Float64()
	case slog.KindBool:
		m[key] = v.Bool()
	case slog.KindDuration:
		m[key] = v.Duration().String()
	case slog.KindTime:
		m[key] = v.Time().UTC().Format(time.RFC3339Nano)
	default:
		switch x := v.Any().(type) {
		case error:
			m[key] = x.Error()
		case fmt.Stringer:
			m[key] = x.String()
		case []string:
			m[key] = x
		default:
			m[key] = fmt.Sprint(x)
		}
	}
}

// stdLogWriter turns the standard log package's lines (u-root's dhclient logs
// with it) into debug records of the console logger.
type stdLogWriter struct {
	log    *slog.Logger
	source string
}

func (w stdLogWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if line != "" {
			w.log.Debug(line, "from", w.source)
		}
	}
	return len(p), nil
}
