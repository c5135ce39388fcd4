package site

import "github.com/better-compute/bcd/boot"

// TFTPStats returns the TFTP server's counters, and false when it is not
// running. A metrics scrape reads them: the server counts anyway, so this
// costs it nothing.
func (s *Site) TFTPStats() (boot.TFTPStats, bool) {
	if r := s.running.Load(); r != nil && r.tftp != nil {
		return r.tftp.Stats(), true
	}
	return boot.TFTPStats{}, false
}

// HTTPStats returns the boot HTTP server's counters, and false when it is not
// running (no [boot]).
func (s *Site) HTTPStats() (boot.HTTPStats, bool) {
	if r := s.running.Load(); r != nil && r.boot != nil {
		// Every copy of the configured server shares its counters.
		return r.boot.base.Load().Stats(), true
	}
	return boot.HTTPStats{}, false
}

// WitnessStats counts the boot server's nonce and witness refusals; false
// when it does not run.
func (s *Site) WitnessStats() (WitnessStats, bool) {
	if r := s.running.Load(); r != nil && r.boot != nil && r.boot.witness != nil {
		return r.boot.witness.stats(), true
	}
	return WitnessStats{}, false
}
