package testbed

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/ipxe"
	"github.com/better-compute/bcd/protocol"
)

// The lab's provisioning network: the bridge holds the boot server's address; the
// site's own DHCP server (dnsmasq, addresses only) is another host on the bridge.
const (
	bootIP   = "10.20.0.2"
	bootURL  = "http://10.20.0.2:8080"
	dhcpHost = "10.20.0.3"
)

// pxeLab is a namespace with a bridge, an ordinary site DHCP server on it, and the
// boot servers of package boot (proxyDHCP, TFTP, HTTP) bound inside it.
type pxeLab struct {
	t       *testing.T
	ns      *Netns
	dir     string
	kernel  string
	table   *boot.MemTable
	proxy   *boot.ProxyDHCP
	dhcp    *Process
	mu      sync.Mutex
	nonces  map[string]string // MAC → last nonce minted
	events  []boot.Event
	macs    map[string]string // MAC → reserved IP
	nextTap int
}

func newPXELab(t *testing.T, macs map[string]string) *pxeLab {
	t.Helper()
	kernel := needLab(t)
	testenv.NeedTool(t, "dnsmasq")
	for _, f := range []string{"/usr/lib/ipxe/ipxe.efi", "/usr/lib/ipxe/undionly.kpxe"} {
		if _, err := os.Stat(f); err != nil {
			testenv.Skip(t, "Debian's ipxe package is not installed ("+f+")")
		}
	}
	lab := &pxeLab{t: t, dir: t.TempDir(), kernel: kernel, table: &boot.MemTable{}, nonces: map[string]string{}, macs: macs}
	id := os.Getpid() % 100000
	ns, err := NewNetns(fmt.Sprintf("bcdlab%d", id))
	if err != nil {
		t.Fatal(err)
	}
	lab.ns = ns
	dhcpNS, err := NewNetns(fmt.Sprintf("bcddhcp%d", id))
	if err != nil {
		ns.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		if lab.dhcp != nil {
			lab.dhcp.Stop(5 * time.Second)
		}
		dhcpNS.Close()
		ns.Close()
	})
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ns.AddBridge("br0", bootIP+"/24"))
	must(Veth(ns, "vdhcp", "", dhcpNS, "eth0", dhcpHost+"/24"))
	must(ns.Run("ip", "link", "set", "vdhcp", "master", "br0"))
	// The 2019 iPXE waits ~16 s for an IPv6 router advertisement unless one comes.
	must(dhcpNS.Run("ip", "addr", "add", "fd00:20::3/64", "dev", "eth0", "nodad"))
	lab.dhcp, err = SiteDHCP{Iface: "eth0", Range: "10.20.0.100,10.20.0.199", Hosts: macs, Dir: filepath.Join(lab.dir, "dhcp"), IPv6RA: true}.Start(dhcpNS)
	must(err)

	tftpRoot := filepath.Join(lab.dir, "tftp")
	os.MkdirAll(tftpRoot, 0o755)
	for _, f := range []string{"undionly.kpxe", "ipxe.efi", "snponly.efi"} {
		must(copyFile("/usr/lib/ipxe/"+f, filepath.Join(tftpRoot, f)))
	}
	ramdisk := filepath.Join(lab.dir, "ramdisk")
	os.MkdirAll(ramdisk, 0o755)
	must(copyFile(kernel, filepath.Join(ramdisk, "vmlinuz")))
	must(BusyboxInitramfs(filepath.Join(ramdisk, "initrd"), MarkerInit("BCD-RAMDISK-UP"), nil))

	observer := boot.ObserverFunc(func(e boot.Event) {
		lab.mu.Lock()
		lab.events = append(lab.events, e)
		lab.mu.Unlock()
	})
	lab.proxy = &boot.ProxyDHCP{Interface: "br0", ServerIP: netip.MustParseAddr(bootIP), URL: bootURL, Table: lab.table, Observer: observer}
	tftp := &boot.TFTPServer{Addr: bootIP + ":69", Root: tftpRoot, Observer: observer}
	httpSrv := &boot.HTTPServer{URL: bootURL, Table: lab.table, RamdiskDir: ramdisk, BinDir: tftpRoot,
		Kernel: bootURL + "/ramdisk/vmlinuz", Initrd: bootURL + "/ramdisk/initrd", Cmdline: "console=ttyS0 panic=-1",
		Params: ipxe.Params{GatewayURL: "https://10.20.0.2:8444", ServerName: "gw.lab.test", Site: "lab",
			ServingCAPin: testPin, JoinSigningPin: testPin, JoinEncryptionPin: testPin},
		Nonces: boot.NonceMinterFunc(func(mac net.HardwareAddr) (string, error) {
			n, err := protocol.NewBootNonce()
			lab.mu.Lock()
			lab.nonces[mac.String()] = n
			lab.mu.Unlock()
			return n, err
		}),
		Observer: observer}
	var httpLn net.Listener
	// Sockets opened inside the namespace stay there; serving runs anywhere.
	must(ns.Do(func() error {
		if err := lab.proxy.Listen(); err != nil {
			return err
		}
		if err := tftp.Listen(); err != nil {
			return err
		}
		var err error
		httpLn, err = net.Listen("tcp", bootIP+":8080")
		return err
	}))
	for _, serve := range []func() error{
		func() error { return lab.proxy.Serve(ctx) },
		func() error { return tftp.Serve(ctx) },
		func() error { return httpSrv.Serve(ctx, httpLn) },
	} {
		wg.Add(1)
		go func() { defer wg.Done(); serve() }()
	}
	return lab
}

// testPin is a well-formed pin; the marker ramdisk only prints it.
const testPin = "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="

func (lab *pxeLab) setTable(entries map[string]boot.Entry) {
	if err := lab.table.Set(entries); err != nil {
		lab.t.Fatal(err)
	}
}

// vm starts a VM whose only NIC is on the bridge.
func (lab *pxeLab) vm(name string, c VMConfig) *VM {
	lab.t.Helper()
	lab.nextTap++
	tap := fmt.Sprintf("tap%d", lab.nextTap)
	if err := lab.ns.AddTap(tap, "br0"); err != nil {
		lab.t.Fatal(err)
	}
	c.Name, c.Dir, c.Tap = name, filepath.Join(lab.dir, name), tap
	vm, err := StartVM(lab.ns, c)
	if err != nil {
		lab.t.Fatal(err)
	}
	lab.t.Cleanup(vm.Stop)
	return vm
}

// wait waits for a console line or fails printing the console, the DHCP log and the
// boot servers' counters.
func (lab *pxeLab) wait(vm *VM, re string, timeout time.Duration) {
	lab.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := vm.WaitConsole(ctx, regexp.MustCompile(re)); err != nil {
		lab.t.Fatalf("%v\n%s\n%s\nproxyDHCP: %+v\nevents: %+v", err, vm.Tail(30), lab.dhcp.Tail(20), lab.proxy.Stats(), lab.eventsFor(vm.Config.MAC))
	}
}

func (lab *pxeLab) eventsFor(mac string) []string {
	lab.mu.Lock()
	defer lab.mu.Unlock()
	var out []string
	ip := lab.macs[strings.ToLower(mac)]
	for _, e := range lab.events {
		// TFTP and the kernel carry no MAC: the site DHCP's reservation gives the IP.
		if strings.EqualFold(e.MAC.String(), mac) || (e.MAC == nil && ip != "" && e.IP.String() == ip) {
			out = append(out, fmt.Sprintf("%s %s", e.Served, e.File))
		}
	}
	return out
}

func (lab *pxeLab) nonce(mac string) string {
	lab.mu.Lock()
	defer lab.mu.Unlock()
	return lab.nonces[strings.ToLower(mac)]
}

const (
	macBIOS    = "52:54:00:20:00:11"
	macUEFI    = "52:54:00:20:00:12"
	macUnknown = "52:54:00:20:00:13"
	macLocalB  = "52:54:00:20:00:14"
	macLocalU  = "52:54:00:20:00:15"
)

// TestPXEWithRealFirmware boots real firmware against the boot servers: SeaBIOS with
// QEMU's iPXE ROM, and OVMF's own EDK2 PXE (which fetches ipxe.efi over our TFTP),
// each to a ramdisk that prints the boot nonce only our script put on its command
// line; a machine without an entry gets an address from the site's DHCP and nothing
// from us; a machine whose entry is local falls through to its disk under both
// firmwares.
func TestPXEWithRealFirmware(t *testing.T) {
	lab := newPXELab(t, map[string]string{
		macBIOS: "10.20.0.111", macUEFI: "10.20.0.112", macUnknown: "10.20.0.113", macLocalB: "10.20.0.114", macLocalU: "10.20.0.115",
	})
	lab.setTable(map[string]boot.Entry{
		macBIOS:   {Mode: boot.ModeRamdisk},
		macUEFI:   {Mode: boot.ModeRamdisk},
		macLocalB: {Mode: boot.ModeLocal},
		macLocalU: {Mode: boot.ModeLocal},
	})
	ramdiskUp := func(t *testing.T, name string, c VMConfig) {
		vm := lab.vm(name, c)
		lab.wait(vm, `BCD-RAMDISK-UP`, 5*time.Minute)
		took := time.Since(vm.Started)
		nonce := lab.nonce(c.MAC)
		b, _ := os.ReadFile(vm.Serial)
		if nonce == "" || !regexp.MustCompile(`cmdline: .*bcd\.boot_nonce=`+regexp.QuoteMeta(nonce)+`(\s|$)`).Match(b) {
			t.Fatalf("the ramdisk's command line lacks the nonce our script minted (%q)\n%s", nonce, vm.Tail(20))
		}
		if !strings.Contains(string(b), "bcd.site=lab") {
			t.Errorf("the ramdisk's command line lacks bcd.site=lab")
		}
		vm.Stop()
		t.Logf("%s: power-on to ramdisk marker %s (accelerator %s); served: %v", name, took.Round(100*time.Millisecond), Accelerator(), lab.eventsFor(c.MAC))
	}

	t.Run("bios-ipxe-rom", func(t *testing.T) {
		ramdiskUp(t, "bios", VMConfig{Firmware: BIOS, MAC: macBIOS, PXEFirst: true})
	})
	t.Run("uefi-edk2-pxe-tftp", func(t *testing.T) {
		ramdiskUp(t, "uefi", VMConfig{Firmware: UEFI, MAC: macUEFI, PXEFirst: true, NoNICROM: true})
		served := strings.Join(lab.eventsFor(macUEFI), ",")
		if !strings.Contains(served, "ipxe.efi") && !strings.Contains(served, "snponly.efi") {
			t.Errorf("OVMF's PXE did not fetch iPXE over our TFTP: %s", served)
		}
	})
	t.Run("no-entry-no-answer", func(t *testing.T) {
		before := lab.proxy.Stats()
		vm := lab.vm("unknown", VMConfig{Firmware: BIOS, MAC: macUnknown, PXEFirst: true})
		// The site's DHCP answers it; iPXE then finds nothing to boot, since we stay silent.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		for ctx.Err() == nil {
			b, _ := os.ReadFile(lab.dhcp.Log)
			if regexp.MustCompile(`DHCPACK\S* 10\.20\.0\.113 ` + macUnknown).Match(b) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if ctx.Err() != nil {
			t.Fatalf("the site DHCP never acked %s\n%s", macUnknown, lab.dhcp.Tail(30))
		}
		lab.wait(vm, `(?i)(nothing to boot|no more network devices|no bootable device)`, 3*time.Minute)
		if ev := lab.eventsFor(macUnknown); len(ev) != 0 {
			t.Errorf("a machine without an entry was served: %v", ev)
		}
		after := lab.proxy.Stats()
		if after.Offers != before.Offers || after.Acks != before.Acks {
			t.Errorf("proxyDHCP answered a machine without an entry: before %+v after %+v", before, after)
		}
	})
	for _, fw := range []string{BIOS, UEFI} {
		t.Run("local-"+fw, func(t *testing.T) {
			mac := macLocalB
			if fw == UEFI {
				mac = macLocalU
			}
			dir := t.TempDir()
			initrd := filepath.Join(dir, "initrd")
			if err := BusyboxInitramfs(initrd, MarkerInit("BCD-LOCAL-DISK-BOOTED"), nil); err != nil {
				t.Fatal(err)
			}
			disk := BootDisk{Path: filepath.Join(dir, "disk.img"), Kernel: lab.kernel, Initrd: initrd, Cmdline: "console=ttyS0 panic=-1"}
			if err := disk.Build(); err != nil {
				t.Fatal(err)
			}
			vm := lab.vm("local-"+fw, VMConfig{Firmware: fw, MAC: mac, PXEFirst: true, Disk: disk.Path})
			lab.wait(vm, `BCD-LOCAL-DISK-BOOTED`, 5*time.Minute)
			b, _ := os.ReadFile(vm.Serial)
			if !strings.Contains(string(b), "booting from the local disk") {
				t.Errorf("the disk booted without our local script (did PXE run?)\n%s", vm.Tail(30))
			}
			t.Logf("local-%s: power-on to disk marker %s; served: %v", fw, time.Since(vm.Started).Round(100*time.Millisecond), lab.eventsFor(mac))
		})
	}
}
