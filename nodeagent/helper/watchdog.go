package helper

import (
	"context"
	"time"
)

// WatchdogGrace is how long after a pending update's deadline the helper's
// watchdog swaps it back: the node's own watchdog acts at the deadline, so
// the helper's acts only when the node could not (it hangs, or crash-loops
// before its watchdog runs).
const WatchdogGrace = 30 * time.Second

// EnvTestGrace, in a fakehw build only, replaces WatchdogGrace (a Go
// duration), so the end-to-end tests need not wait 30 s.
const EnvTestGrace = "BCD_TEST_HELPER_GRACE"

// WatchdogWhy is what the watchdog marks upgrade.json with.
const WatchdogWhy = "still unconfirmed 30 s after its deadline; bcd helper swapped back"

// armWatchdog arms the timer for a pending update that was not swapped back,
// at its deadline plus Grace. Called at start and after every swap.
func (s *Server) armWatchdog() {
	st, err := s.Update.Status()
	if err != nil {
		s.Logger.Error("bcd helper: the watchdog cannot read the update records", "err", err.Error())
		return
	}
	p := st.Pending
	if p == nil || p.SwappedBack != nil {
		return
	}
	id := p.Version + "@" + p.Deadline.String()
	at := p.Deadline.Add(s.Grace)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchdog != nil {
		s.watchdog.Stop()
	}
	s.wdFor = id
	s.watchdog = time.AfterFunc(time.Until(at), func() { s.watchdogFired(id) })
	s.Logger.Info("bcd helper: the watchdog is armed", "version", p.Version, "deadline", p.Deadline, "fires_at", at)
}

// stopWatchdog stops the timer: the update confirmed or was swapped back.
func (s *Server) stopWatchdog() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watchdog != nil {
		s.watchdog.Stop()
		s.watchdog = nil
		s.wdFor = ""
	}
}

// watchdogFired swaps back the update id if it is still pending and not
// swapped back, and restarts bcd.service so the node runs the old binary.
func (s *Server) watchdogFired(id string) {
	acted := false
	if s.onFired != nil {
		defer func() { s.onFired(acted) }()
	}
	s.mu.Lock()
	if s.wdFor != id {
		s.mu.Unlock()
		return
	}
	s.watchdog, s.wdFor = nil, ""
	s.mu.Unlock()
	st, err := s.Update.Status()
	if err != nil {
		s.Logger.Error("bcd helper: the watchdog cannot read the update records", "err", err.Error())
		return
	}
	p := st.Pending
	if p == nil || p.SwappedBack != nil || p.Version+"@"+p.Deadline.String() != id {
		s.Logger.Info("bcd helper: the watchdog fired, but the update was confirmed or swapped back", "update", id)
		return
	}
	s.Logger.Warn("bcd helper: the update is still unconfirmed after its deadline; swapping back", "version", p.Version, "deadline", p.Deadline, "grace", s.Grace)
	if err := s.Update.SwapBack(WatchdogWhy); err != nil {
		s.Logger.Error("bcd helper: the watchdog could not swap back", "version", p.Version, "err", err.Error())
		return
	}
	acted = true
	if s.RestartNode == nil {
		s.Logger.Error("bcd helper: swapped back, but cannot restart bcd.service: restart bcd node by hand", "version", p.Version)
		return
	}
	s.Logger.Info("bcd helper: restarting bcd.service to run the swapped-back binary", "version", p.Version)
	if err := s.RestartNode(context.Background()); err != nil {
		s.Logger.Error("bcd helper: swapped back, but could not restart the node", "version", p.Version, "err", err.Error())
		return
	}
	s.Logger.Info("bcd helper: restarted bcd.service", "version", p.Version)
}
