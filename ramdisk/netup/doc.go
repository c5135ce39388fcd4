// Package netup brings a ramdisk's network up: every physical NIC is set up, those
// with a carrier ask for a DHCPv4 lease through u-root's dhclient (nclient4), and
// each lease is configured (address, default route, resolv.conf). Every wait is
// bounded, and the result names each NIC's MAC and address, so a machine that does
// not reach its gateway says on its console which link or lease is missing.
package netup
