package site

import "github.com/better-compute/bcd/boot"

// DHCPStats returns the proxyDHCP's counters; ok is false while it does not
// run ([boot] without proxy_dhcp, or before Run opened it). A metrics scrape
// reads them: the servers count anyway, so this costs them nothing.
func (s *Site) DHCPStats() (_ boot.DHCPStats, ok bool) {
	bs := s.running.Load()
	if bs == nil || bs.dhcp == nil {
		return boot.DHCPStats{}, false
	}
	return bs.dhcp.Stats(), true
}

// TFTPStats returns the TFTP server's counters; ok is false while it does not
// run.
func (s *Site) TFTPStats() (_ boot.TFTPStats, ok bool) {
	bs := s.running.Load()
	if bs == nil || bs.tftp == nil {
		return boot.TFTPStats{}, false
	}
	return bs.tftp.Stats(), true
}
