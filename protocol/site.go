package protocol

import "time"

// Spec section names.
const (
	SectionBoot      = "boot"       // a site's boot table: BootSection
	SectionBMCHosts  = "bmc_hosts"  // a site's BMCs: BMCHostsSection
	SectionHTTPProxy = "http_proxy" // a site's proxy for the boot network: HTTPProxySection
)

// Boot modes of a boot entry.
const (
	BootRamdisk = "ramdisk" // PXE-boot the ramdisk
	BootLocal   = "local"   // boot the installed disk
)

// BootSection is the site's boot table: what each machine it serves should boot. A
// machine without an entry is not answered at all, so the site never fights a
// network's own DHCP over machines that are not ours.
type BootSection struct {
	Entries []BootEntry `json:"entries"`
}

// BootEntry is one machine's boot entry, by MAC (lowercase, colon-separated).
//
// It names no machine: the control plane finds the machine of a site's event by
// the site and the MAC (the one thing the firmware shows), so an id sent out only
// to come back would be a second key that could disagree. Earlier versions sent
// "machine" here and sites echoed it in machine.booted and boot.nonce; nothing read
// it back, and encoding/json ignores that key from an older peer.
type BootEntry struct {
	MAC     string `json:"mac"`
	Mode    string `json:"mode"`              // BootRamdisk or BootLocal
	Kernel  string `json:"kernel,omitempty"`  // ramdisk: URL; empty means the site's [boot] kernel
	Initrd  string `json:"initrd,omitempty"`  // ramdisk: URL; empty means the site's [boot] initrd
	Cmdline string `json:"cmdline,omitempty"` // ramdisk: extra kernel parameters
}

// MachineBooted is the data of a machine.booted event: one step of a machine's boot
// that the site agent served.
type MachineBooted struct {
	MAC        string    `json:"mac"`
	Stage      string    `json:"stage"`                 // dhcp, pxe, tftp, script, kernel, initrd
	Arch       int       `json:"arch,omitempty"`        // DHCP option 93
	ClientGUID string    `json:"client_guid,omitempty"` // DHCP option 97
	IP         string    `json:"ip,omitempty"`
	File       string    `json:"file,omitempty"` // what was served
	Time       time.Time `json:"time"`
	// Count is how many times the site served this stage to this machine that the
	// event stands for: a boot storm or a boot loop is coalesced per MAC and stage
	// into about one event a second. Absent (0) means 1, as sites before it sent.
	Count int `json:"count,omitempty"`
}

// BootNonce is the data of a boot.nonce event: the nonce the site put on a machine's
// ramdisk command line. The discovery attestor accepts it once, from that MAC, before
// it expires.
type BootNonce struct {
	MAC       string    `json:"mac"`
	Nonce     string    `json:"nonce"`
	ExpiresAt time.Time `json:"expires_at"`
	// IP and Interface are the L2 evidence the site minted it on: the
	// script's client address, whose neighbour entry on Interface is MAC.
	IP        string `json:"ip,omitempty"`
	Interface string `json:"interface,omitempty"`
}

// HTTPProxySection is a site's http_proxy section: the proxy the site agent runs on
// the provisioning network, the machines' only way to the gateway and to image
// servers. It forwards CONNECT (and plain GET for http:// image URLs) only to the
// destinations listed, so a machine on the boot network reaches nothing else.
type HTTPProxySection struct {
	// Listen is host:port on the provisioning network, e.g. 10.20.0.2:3128.
	Listen string `json:"listen"`
	// Allow lists the host:port destinations the proxy forwards to. The gateway's
	// host:port is always allowed.
	Allow []string `json:"allow,omitempty"`
}
