package netup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/vishvananda/netlink"
)

// Defaults of Config.
const (
	DefaultLinkTimeout = 10 * time.Second
	DefaultDHCPTimeout = 5 * time.Second
	DefaultDHCPRetries = 3
)

// Config bounds the bring-up.
type Config struct {
	// LinkTimeout is how long a NIC may take to report a carrier.
	LinkTimeout time.Duration
	// DHCPTimeout is one DHCP exchange's wait; DHCPRetries how often it is sent.
	DHCPTimeout time.Duration
	DHCPRetries int
	// Sys is the sysfs root; "" is /sys.
	Sys string
	// Log receives a line per NIC; nil discards.
	Log *slog.Logger
}

// NIC is one network interface as the bring-up left it.
type NIC struct {
	Name string
	MAC  string
	// Carrier is whether the link came up.
	Carrier bool
	// Addr is the address DHCP gave (CIDR), Router the default gateway, DNS the
	// name servers; empty without a lease.
	Addr   string
	Router string
	DNS    []string
	// Err is why the NIC has no address.
	Err string
}

// ErrNoLease is returned by Up when no NIC got an address.
var ErrNoLease = errors.New("no network interface got a DHCP lease")

// Physical lists the machine's physical Ethernet NICs (those with a device behind
// them in sysfs), sorted by name: bridges, bonds, tunnels and loopback are not.
func Physical(sys string) ([]netlink.Link, error) {
	if sys == "" {
		sys = "/sys"
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list network interfaces: %w", err)
	}
	var out []netlink.Link
	for _, l := range links {
		a := l.Attrs()
		if a.EncapType != "ether" || len(a.HardwareAddr) != 6 {
			continue
		}
		if _, err := os.Stat(filepath.Join(sys, "class/net", a.Name, "device")); err != nil {
			continue
		}
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Attrs().Name < out[j].Attrs().Name })
	return out, nil
}

// Up brings loopback and every physical NIC up, runs DHCPv4 on each NIC that has a
// link, and configures each lease (address, default route, resolv.conf). It returns
// every NIC with what happened to it, and ErrNoLease when none got an address. It
// gives up on a NIC after LinkTimeout without carrier and DHCPRetries exchanges of
// DHCPTimeout each; the caller decides whether to run it again.
func Up(ctx context.Context, cfg Config) ([]NIC, error) {
	if cfg.LinkTimeout <= 0 {
		cfg.LinkTimeout = DefaultLinkTimeout
	}
	if cfg.DHCPTimeout <= 0 {
		cfg.DHCPTimeout = DefaultDHCPTimeout
	}
	if cfg.DHCPRetries <= 0 {
		cfg.DHCPRetries = DefaultDHCPRetries
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		if err := netlink.LinkSetUp(lo); err != nil {
			log.Warn("could not bring up loopback", "error", err.Error())
		}
	}
	links, err := Physical(cfg.Sys)
	if err != nil {
		return nil, err
	}
	if len(links) == 0 {
		return nil, fmt.Errorf("%w: the machine has no Ethernet NIC (is its driver in the ramdisk?)", ErrNoLease)
	}
	nics := make([]NIC, len(links))
	var up []netlink.Link
	var upIdx []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, l := range links {
		nics[i] = NIC{Name: l.Attrs().Name, MAC: l.Attrs().HardwareAddr.String()}
		wg.Add(1)
		go func(i int, name string) {
			defer wg.Done()
			link, err := dhclient.IfUp(name, cfg.LinkTimeout)
			if err == nil && !carrier(cfg.Sys, name) {
				err = fmt.Errorf("no carrier after %s", cfg.LinkTimeout)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				nics[i].Err = err.Error()
				return
			}
			nics[i].Carrier = true
			up = append(up, link)
			upIdx = append(upIdx, i)
		}(i, nics[i].Name)
	}
	wg.Wait()
	for _, n := range nics {
		if !n.Carrier {
			log.Info("network interface has no link", "nic", n.Name, "mac", n.MAC, "error", n.Err)
		}
	}
	byName := map[string]int{}
	for k, i := range upIdx {
		byName[up[k].Attrs().Name] = i
	}
	if len(up) > 0 {
		dctx, cancel := context.WithTimeout(ctx, cfg.DHCPTimeout*time.Duration(cfg.DHCPRetries+1)+cfg.LinkTimeout)
		defer cancel()
		results := dhclient.SendRequests(dctx, up, true, false, dhclient.Config{
			Timeout: cfg.DHCPTimeout,
			Retries: cfg.DHCPRetries,
		}, cfg.LinkTimeout)
		// Configure in name order, not arrival order: with leases on several
		// NICs the last default route wins, and the same machine should end up
		// with the same one on every boot.
		var all []*dhclient.Result
		for r := range results {
			all = append(all, r)
		}
		sort.Slice(all, func(i, j int) bool { return all[i].Interface.Attrs().Name < all[j].Interface.Attrs().Name })
		for _, r := range all {
			i, ok := byName[r.Interface.Attrs().Name]
			if !ok {
				continue
			}
			n := &nics[i]
			if r.Err != nil {
				n.Err = "DHCP: " + r.Err.Error()
				log.Warn("no DHCP lease", "nic", n.Name, "mac", n.MAC, "error", r.Err.Error())
				continue
			}
			if err := r.Lease.Configure(); err != nil {
				n.Err = "configure the lease: " + err.Error()
				log.Warn("could not configure the DHCP lease", "nic", n.Name, "mac", n.MAC, "error", err.Error())
				continue
			}
			describe(n, r.Lease)
			log.Info("network interface configured", "nic", n.Name, "mac", n.MAC, "address", n.Addr,
				"router", n.Router, "dns", strings.Join(n.DNS, ","))
		}
	}
	for _, n := range nics {
		if n.Addr != "" {
			return nics, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return nics, err
	}
	return nics, ErrNoLease
}

func carrier(sys, name string) bool {
	if sys == "" {
		sys = "/sys"
	}
	b, err := os.ReadFile(filepath.Join(sys, "class/net", name, "carrier"))
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

func describe(n *NIC, l dhclient.Lease) {
	ack, _ := l.Message()
	if ack == nil {
		return
	}
	ip := net.IPNet{IP: ack.YourIPAddr, Mask: ack.SubnetMask()}
	if ip.Mask == nil {
		ip.Mask = ack.YourIPAddr.DefaultMask()
	}
	n.Addr = ip.String()
	if r := ack.Router(); len(r) > 0 {
		n.Router = r[0].String()
	}
	for _, d := range ack.DNS() {
		n.DNS = append(n.DNS, d.String())
	}
}
