//go:build e2edebian

package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// debianStockCmdline is the stock disk's own loaders' command line (its
// "GRUB configuration"): deploy does not read it, so it matters only for
// boots from the disk.
const debianStockCmdline = "root=LABEL=root ro console=ttyS0,115200 panic=30"

// debianStockReport is the lab's evidence in the operator's user data: cloud-init
// writes it and runs it (runcmd) as a transient unit, which waits for bcd.service
// and prints the hostname, the default user's authorized_keys and bcd's state on
// the console. Nothing of it is in the image. The proxy bcd's units need (the
// site's proxy is the lab machines' only way out) is the deploy's drop-in.
//
// On UEFI it also prints the firmware's boot entries (efibootmgr) at every boot,
// and on the first deploy does to them what grub-install does (efibootmgr -c: a
// new entry for the disk, first in BootOrder) and reboots: the node's
// bcd-boot-order.service must put the network entry first again, so the
// machine's next boot reaches the site agent.
const debianStockReport = `#cloud-config
write_files:
  - path: /usr/local/sbin/lab-report
    permissions: '0755'
    content: |
      #!/bin/sh
      i=0
      while [ "$(systemctl is-active bcd.service)" != active ] && [ $i -lt 240 ]; do sleep 0.5; i=$((i + 1)); done
      {
        echo "bcd-lab: hostname: $(hostname)"
        for f in /home/debian/.ssh/authorized_keys /root/.ssh/authorized_keys; do
          if [ -f $f ]; then sed "s|^|bcd-lab: $f: |" $f; else echo "bcd-lab: $f: absent"; fi
        done
        echo "bcd-lab: bcd on disk: $(ls /usr/local/bin/bcd 2>&1)"
        echo "bcd-lab: systemctl is-active bcd: $(systemctl is-active bcd.service)"
      } >/dev/console 2>&1
      if [ -d /sys/firmware/efi ] && ! efibootmgr | grep -q grub-install; then
        {
          efibootmgr -c -d /dev/vda -p 1 -L grub-install -l '\EFI\BOOT\BOOTX64.EFI' | sed 's/^/bcd-lab: grub-install: /'
          echo "bcd-lab: grub-install done"
        } >/dev/console 2>&1
        systemctl reboot
      fi
  - path: /var/lib/cloud/scripts/per-boot/lab-efi
    permissions: '0755'
    content: |
      #!/bin/sh
      [ -d /sys/firmware/efi ] || exit 0
      {
        efibootmgr | sed 's/^/bcd-lab: efi: /'
        echo "bcd-lab: efi report end"
      } >/dev/console 2>&1
runcmd:
  - [systemd-run, --no-block, --unit=lab-report, /usr/local/sbin/lab-report]
`

// TestDebianStockImage is issue 18's proof in the lab: a stock Debian cloud image
// (DebianStockOS: systemd, cloud-init, openssh-server, nothing of bcd), a
// qemu-img convert -c -O qcow2 of it on the lab's image server, registered with
// images add, deployed (with the release scripts/release.sh built and signed,
// registered with releases add) to a SeaBIOS and an OVMF machine with machines deploy
// --image NAME --bcd-version V --hostname H --ssh-authorized-keys FILE
// --user-data FILE. The ramdisk installs the node agent into the stock root and
// writes the NoCloud seed; the kexec boots root=PARTUUID=… with the ramdisk's
// console (the image has no command line of its own). Both machines must reach
// provisioned with their nodes ready, and their consoles (the user data's
// report) must show the hostname given, the key in the default user's
// authorized_keys and bcd.service active. Then the SeaBIOS machine is deployed
// again with a different image (the lab's Debian flavour, raw.zst, which ships
// bcd) and must come back ready with a new node.
func TestDebianStockImage(t *testing.T) {
	lab := newDebianLab(t, "ipmi_sim", "ipmitool", "qemu-img", "ssh-keygen")
	dir := lab.dir
	stock := filepath.Join(dir, "debian-stock.qcow2")
	virtual, err := (DebianStockOS{Cmdline: debianStockCmdline, Repo: lab.repo, Log: testLog{t}}).Build(stock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stock image: %d MiB qcow2 (compressed clusters), %d MiB virtual (ready after %s)",
		fileSize(stock)>>20, virtual>>20, time.Since(lab.began).Round(time.Second))

	// The operator's inputs: a key pair's public half, and the user data.
	keyFile := filepath.Join(dir, "id_ed25519")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "operator@lab", "-f", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	pub, err := os.ReadFile(keyFile + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	pubKey := strings.TrimSpace(string(pub))
	userData := filepath.Join(dir, "user-data")
	if err := os.WriteFile(userData, []byte(debianStockReport), 0o644); err != nil {
		t.Fatal(err)
	}

	// The release the ramdisk installs into the stock root, signed as an
	// operator cuts one (bcd for amd64 only: what the lab's machines run).
	dist := filepath.Join(dir, "dist")
	releaseKey := filepath.Join(dir, "release.key")
	pinOut, err := exec.Command(lab.bin.BetterCompute, "release", "keygen", "--out", releaseKey).Output()
	if err != nil {
		t.Fatalf("release keygen: %v", err)
	}
	pin := strings.TrimSpace(string(pinOut))
	if err := runReleaseScript(lab.repo, "VERSION="+debianRelease, "DIST="+dist, "ARCHES=amd64", "PRODUCTS=bcd",
		"BCD_RELEASE_KEYS="+releaseKey, "BCD_RELEASE_SEQUENCE=1", "BCD_RELEASE_EXPIRES=24h"); err != nil {
		t.Fatal(err)
	}

	diskMiB := int(virtual>>20) + 256
	if fileSize(lab.image)>>20 > int64(virtual>>20) {
		diskMiB = int(fileSize(lab.image)>>20) + 256
	}
	machines := []*FleetMachine{
		{Name: "stock-bios", Firmware: BIOS, MAC: "52:54:00:31:18:01", DiskMiB: diskMiB},
		// No bootindex: OVMF's variables decide what boots, and the BMC's boot
		// device changes nothing (a machine that can only be power cycled).
		{Name: "stock-uefi", Firmware: UEFI, MAC: "52:54:00:31:18:02", DiskMiB: diskMiB, NVRAMBootOrder: true},
	}
	hostnames := map[string]string{"stock-bios": "web-bios-1", "stock-uefi": "web-uefi-1"}
	f := &Fleet{Dir: filepath.Join(dir, "lab"), Bin: lab.bin, Kernel: lab.kernel, Ramdisk: lab.ramdisk, Image: lab.image, Log: testLog{t},
		Machines: machines, Downloads: dist, ProxyAllow: []string{apiAddr}, ServeArgs: []string{"--release-pins", pin}}
	ctx := context.Background()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fail := func(err error) {
		t.Helper()
		t.Fatalf("%v\n%s", err, f.Diagnostics())
	}

	url, sha, size, err := f.PublishFile("debian-stock.qcow2", stock)
	if err != nil {
		fail(err)
	}
	if _, err := f.BC("images", "add", "debian-stock", "--url", url, "--sha256", sha, "--size", fmt.Sprint(size),
		"--format", "qcow2", "--image-size", fmt.Sprint(virtual)); err != nil {
		fail(err)
	}

	began := time.Now()
	// The node agent's install is what makes a stock image a node: without it
	// this test cannot pass, and says so.
	help, _ := exec.Command(lab.bin.BetterCompute, "machines", "deploy", "--help").CombinedOutput()
	for _, flag := range []string{"--bcd-version", "--hostname", "--ssh-authorized-keys", "--user-data"} {
		if !strings.Contains(string(help), flag) {
			t.Fatalf("node agent install not available: better-compute machines deploy has no %s flag", flag)
		}
	}
	if out, err := f.BC("releases", "add", filepath.Join(dist, "manifest.json")); err != nil {
		fail(fmt.Errorf("releases add: %w", err))
	} else if !strings.Contains(out, "release "+debianRelease) {
		fail(fmt.Errorf("releases add: %q", out))
	}

	for _, m := range machines {
		if _, err := f.BC("machines", "deploy", m.Name, "--image", "debian-stock", "--bcd-version", debianRelease,
			"--hostname", hostnames[m.Name], "--ssh-authorized-keys", keyFile+".pub", "--user-data", userData); err != nil {
			fail(err)
		}
	}
	// Each machine kexecs into the stock kernel with the command line deploy
	// makes for an image that has none: root=PARTUUID=… and the ramdisk's
	// console, so the console keeps showing what the installed OS prints.
	kexecLine := regexp.MustCompile(`Command line: root=PARTUUID=[0-9a-f-]+ ro console=ttyS0,115200[^\r\n]*`)
	nodes := map[string]string{}
	for _, m := range machines {
		serial, err := waitSerialFrom(ctx, m.BMC, 0, kexecLine, 25*time.Minute)
		if err != nil {
			fail(fmt.Errorf("machine %s: no kexec into the stock kernel: %w", m.Name, err))
		}
		t.Logf("machine %s: kexec'd the stock kernel %s after the deploy: %s", m.Name, time.Since(began).Round(time.Second), kexecLine.FindString(serial))
		if err := f.WaitState(ctx, m, "provisioned", 15*time.Minute); err != nil {
			fail(fmt.Errorf("machine %s: the stock OS booted, but the machine is not provisioned (the node agent the ramdisk installs did not join): %w", m.Name, err))
		}
		var node FleetNode
		if err := waitFor(ctx, 5*time.Minute, func() bool {
			var ok bool
			node, ok = f.MachineNode(m)
			return ok && node.State == "ready" && node.Connected
		}); err != nil {
			fail(fmt.Errorf("machine %s: provisioned, but its node is not ready and connected: %+v", m.Name, node))
		}
		nodes[m.Name] = node.ID
		t.Logf("machine %s (%s): node %s ready (bcd %s) %s after the deploy", m.Name, m.Firmware, node.ID, node.DaemonVersion, time.Since(began).Round(time.Second))
	}
	var serial string
	for _, m := range machines {
		serial, err := waitSerialFrom(ctx, m.BMC, 0, regexp.MustCompile(`bcd-lab: systemctl is-active bcd: \S+`), 5*time.Minute)
		if err != nil {
			fail(fmt.Errorf("machine %s: the user data's report: %w", m.Name, err))
		}
		logConsole(t, m.Name, []byte(serial))
		if err := checkStockConsole(serial, hostnames[m.Name], pubKey); err != nil {
			fail(fmt.Errorf("machine %s: %w", m.Name, err))
		}
	}

	// --- The UEFI boot order: the deploy left the network entry first and one
	// bcd entry; the user data's grub-install put a new entry first and
	// rebooted; bcd-boot-order.service put the network entry back, so the
	// reboot went through iPXE (the site agent's local script) to the disk.
	uefi := machines[1]
	serial, err = waitSerialFrom(ctx, uefi.BMC, 0, regexp.MustCompile(`bcd-lab: grub-install done`), 5*time.Minute)
	if err != nil {
		fail(fmt.Errorf("machine %s: the user data's grub-install: %w", uefi.Name, err))
	}
	deployed, err := checkEFIReport(serial, uefi.MAC, "")
	if err != nil {
		fail(fmt.Errorf("machine %s: after the deploy: %w\n%s", uefi.Name, err, efiLines(serial)))
	}
	t.Logf("machine %s: after the deploy: %s", uefi.Name, deployed)
	if out, err := f.BC("machines", "show", uefi.Name); err != nil || !strings.Contains(out, "UEFI BOOT:") {
		fail(fmt.Errorf("machine %s: machines show has no UEFI BOOT line (%v):\n%s", uefi.Name, err, out))
	} else {
		t.Logf("machine %s: machines show: %s", uefi.Name, lineWith(out, "UEFI BOOT:"))
	}
	rebootFrom := len(serial)
	serial, err = waitSerialFrom(ctx, uefi.BMC, rebootFrom, regexp.MustCompile(`(?s)iPXE.*bcd-lab: efi report end`), 10*time.Minute)
	if err != nil {
		fail(fmt.Errorf("machine %s: after grub-install and a reboot, no boot through iPXE back into the OS: %w", uefi.Name, err))
	}
	kept, err := checkEFIReport(serial, uefi.MAC, "grub-install")
	if err != nil {
		fail(fmt.Errorf("machine %s: after grub-install and a reboot: %w\n%s", uefi.Name, err, efiLines(serial)))
	}
	t.Logf("machine %s: after grub-install and a reboot, through the site agent: %s", uefi.Name, kept)

	// --- Redeploys: the SeaBIOS machine with a different image (the lab's
	// Debian flavour, raw.zst, bcd in it already), and meanwhile the UEFI one
	// twice with the stock image, by power cycles only: its NVRAM must boot
	// the network first each time, and keep one bcd entry.
	m := machines[0]
	mark := markSerial(m.BMC)
	again := time.Now()
	if _, err := f.DeployImage(m); err != nil {
		fail(err)
	}
	uefiDone := make(chan error, 1)
	go func() {
		for i := 1; i <= 2; i++ {
			umark := markSerial(uefi.BMC)
			before, _ := f.MachineNode(uefi)
			if _, err := f.BC("machines", "deploy", uefi.Name, "--image", "debian-stock", "--bcd-version", debianRelease,
				"--hostname", hostnames[uefi.Name], "--ssh-authorized-keys", keyFile+".pub", "--user-data", userData); err != nil {
				uefiDone <- err
				return
			}
			if err := waitFor(ctx, 30*time.Minute, func() bool {
				node, ok := f.MachineNode(uefi)
				st, _, _ := f.MachineState(uefi)
				return st == "provisioned" && ok && node.ID != before.ID && node.State == "ready" && node.Connected
			}); err != nil {
				uefiDone <- fmt.Errorf("redeploy %d: no new ready node: %w", i, err)
				return
			}
			serial, err := waitSerialAfter(ctx, uefi.BMC, umark, regexp.MustCompile(`bcd-lab: efi report end`), 5*time.Minute)
			if err != nil {
				uefiDone <- fmt.Errorf("redeploy %d: %w", i, err)
				return
			}
			got, err := checkEFIReport(serial, uefi.MAC, "")
			if err != nil {
				uefiDone <- fmt.Errorf("redeploy %d: %w\n%s", i, err, efiLines(serial))
				return
			}
			if got.bcdEntry != deployed.bcdEntry {
				uefiDone <- fmt.Errorf("redeploy %d: the bcd entry is %s, was %s", i, got.bcdEntry, deployed.bcdEntry)
				return
			}
			t.Logf("machine %s: redeploy %d (power cycles only): %s", uefi.Name, i, got)
		}
		uefiDone <- nil
	}()
	if err := waitFor(ctx, 2*time.Minute, func() bool {
		st, _, _ := f.MachineState(m)
		return st != "provisioned"
	}); err != nil {
		fail(fmt.Errorf("machine %s: still provisioned after the redeploy started", m.Name))
	}
	if err := f.WaitState(ctx, m, "provisioned", 30*time.Minute); err != nil {
		fail(err)
	}
	var node FleetNode
	if err := waitFor(ctx, 5*time.Minute, func() bool {
		var ok bool
		node, ok = f.MachineNode(m)
		return ok && node.ID != nodes[m.Name] && node.State == "ready" && node.Connected
	}); err != nil {
		fail(fmt.Errorf("machine %s: redeployed and provisioned, but no new ready node: %+v (first node %s)", m.Name, node, nodes[m.Name]))
	}
	serial, err = waitSerialAfter(ctx, m.BMC, mark, regexp.MustCompile(`bcd-lab: systemctl is-active bcd: \S+`), 5*time.Minute)
	if err != nil {
		fail(fmt.Errorf("machine %s: after the redeploy: %w", m.Name, err))
	}
	if !strings.Contains(serial, "bcd-lab: systemctl is-active bcd: active") {
		fail(fmt.Errorf("machine %s: after the redeploy, bcd.service is not active:\n%s", m.Name, serial))
	}
	t.Logf("machine %s: redeployed with the Debian flavour: node %s ready %s after the redeploy", m.Name, node.ID, time.Since(again).Round(time.Second))
	if err := <-uefiDone; err != nil {
		fail(fmt.Errorf("machine %s: %w", uefi.Name, err))
	}
	t.Logf("machine %s: redeployed twice %s after the first redeploy started", uefi.Name, time.Since(again).Round(time.Second))
	t.Logf("TestDebianStockImage: %s in all", time.Since(lab.began).Round(time.Second))
}

// efiReport is what the user data's efibootmgr report says about the boot order.
type efiReport struct {
	order, first, bcdEntry string
}

func (r efiReport) String() string {
	return fmt.Sprintf("BootOrder %s, first %s, bcd entry Boot%s", r.order, r.first, r.bcdEntry)
}

var (
	efiOrderLine = regexp.MustCompile(`bcd-lab: efi: BootOrder: ([0-9A-F,]+)`)
	efiEntryLine = regexp.MustCompile(`bcd-lab: efi: Boot([0-9A-F]{4})\*? (.*)`)
)

// checkEFIReport checks the last efibootmgr report in serial: BootOrder starts
// with the network entry of mac (OVMF names them "… (MAC:525400311802)"),
// exactly one entry is bcd's, and, when second is given, the entry with that
// description comes right after the network one (what grub-install put first
// is second now, the rest as it was).
func checkEFIReport(serial, mac, second string) (efiReport, error) {
	serial = stripKernelMessages(serial)
	end := strings.LastIndex(serial, "bcd-lab: efi report end")
	if end < 0 {
		return efiReport{}, errors.New("no efibootmgr report on the console")
	}
	start := strings.LastIndex(serial[:end], "bcd-lab: efi: BootCurrent")
	if start < 0 {
		start = strings.LastIndex(serial[:end], "bcd-lab: efi: BootOrder")
	}
	if start < 0 {
		return efiReport{}, errors.New("the efibootmgr report has no BootOrder")
	}
	block := serial[start:end]
	m := efiOrderLine.FindStringSubmatch(block)
	if m == nil {
		return efiReport{}, errors.New("the efibootmgr report has no BootOrder")
	}
	r := efiReport{order: m[1]}
	desc := map[string]string{}
	var bcd []string
	for _, e := range efiEntryLine.FindAllStringSubmatch(block, -1) {
		d := strings.TrimRight(e[2], "\r")
		desc[e[1]] = d
		if strings.HasPrefix(d, "bcd: ") {
			bcd = append(bcd, e[1])
		}
	}
	order := strings.Split(r.order, ",")
	r.first = order[0] + " " + desc[order[0]]
	want := "MAC:" + strings.ToUpper(strings.ReplaceAll(mac, ":", ""))
	if !strings.Contains(desc[order[0]], want) {
		return r, fmt.Errorf("BootOrder %s starts with Boot%s %q, not the network entry of %s", r.order, order[0], desc[order[0]], mac)
	}
	if len(bcd) != 1 {
		return r, fmt.Errorf("%d bcd entries (%v), want one", len(bcd), bcd)
	}
	r.bcdEntry = bcd[0]
	if second != "" && (len(order) < 2 || desc[order[1]] != second) {
		return r, fmt.Errorf("BootOrder %s: %q is not second", r.order, second)
	}
	return r, nil
}

// efiLines are the console's efibootmgr lines, for a failure's message.
func efiLines(serial string) string {
	var out []string
	for _, l := range strings.Split(serial, "\n") {
		if strings.Contains(l, "bcd-lab: efi") || strings.Contains(l, "bcd-lab: grub-install") || strings.Contains(l, "BdsDxe") {
			out = append(out, strings.TrimRight(l, "\r"))
		}
	}
	return strings.Join(out, "\n")
}

func lineWith(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// checkStockConsole checks the user data's report: the hostname the deploy
// gave, the operator's key in the default user's authorized_keys, and
// bcd.service active.
func checkStockConsole(serial, hostname, pubKey string) error {
	serial = stripKernelMessages(serial)
	if !strings.Contains(serial, "bcd-lab: hostname: "+hostname+"\r") && !strings.Contains(serial, "bcd-lab: hostname: "+hostname+"\n") {
		return fmt.Errorf("the console does not show hostname %s", hostname)
	}
	if !strings.Contains(serial, "bcd-lab: /home/debian/.ssh/authorized_keys: "+pubKey) {
		return fmt.Errorf("the console does not show the key %q in /home/debian/.ssh/authorized_keys", pubKey)
	}
	if !strings.Contains(serial, "bcd-lab: systemctl is-active bcd: active") {
		return fmt.Errorf("bcd.service is not active")
	}
	return nil
}

// waitSerialFrom waits for re in the machine's serial console after its first
// from bytes, and returns that part of the console up to the match's end.
// A power cycle starts a new serial file (the old one becomes serial.prev.log):
// when the file is no longer the one mark saw, it is read from its start.
func waitSerialFrom(ctx context.Context, b *VBMC, from int, re *regexp.Regexp, timeout time.Duration) (string, error) {
	return waitSerialAfter(ctx, b, serialMark{size: from}, re, timeout)
}

// serialMark is a place in a machine's serial console: the file then, and its length.
type serialMark struct {
	fi   os.FileInfo
	size int
}

// markSerial is where the machine's serial console ends now.
func markSerial(b *VBMC) serialMark {
	fi, err := os.Stat(b.Serial())
	if err != nil {
		return serialMark{}
	}
	return serialMark{fi: fi, size: int(fi.Size())}
}

// waitSerialAfter is waitSerialFrom after mark.
func waitSerialAfter(ctx context.Context, b *VBMC, mark serialMark, re *regexp.Regexp, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		from := mark.size
		if fi, err := os.Stat(b.Serial()); err == nil && mark.fi != nil && !os.SameFile(fi, mark.fi) {
			from = 0
		}
		if raw, err := os.ReadFile(b.Serial()); err == nil && len(raw) > from {
			if loc := re.FindIndex(raw[from:]); loc != nil {
				return string(raw[from : from+loc[1]]), nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no serial line matching %q: %w", re, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// TestDebianStockConsoleCheck: the report's checks fail on a wrong hostname, a
// missing key and an inactive bcd, and pass on the report as the user data's
// script prints it.
func TestDebianStockConsoleCheck(t *testing.T) {
	key := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample operator@lab"
	good := "bcd-lab: hostname: web-1\r\nbcd-lab: /home/debian/.ssh/authorized_keys: " + key + "\r\nbcd-lab: systemctl is-active bcd: active\r\n"
	if err := checkStockConsole(good, "web-1", key); err != nil {
		t.Fatal(err)
	}
	for name, serial := range map[string]string{
		"hostname prefix": strings.Replace(good, "web-1", "web-10", 1),
		"no key":          strings.Replace(good, key, "absent", 1),
		"inactive":        strings.Replace(good, ": active", ": inactive", 1),
	} {
		if err := checkStockConsole(serial, "web-1", key); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

// TestDebianStockEFIReportCheck: the boot order check fails when the disk or
// grub-install is first, with no or two bcd entries, and when grub-install is
// not second where it must be; it passes on a report as efibootmgr prints it.
func TestDebianStockEFIReportCheck(t *testing.T) {
	mac := "52:54:00:31:18:02"
	report := func(order string, extra ...string) string {
		lines := []string{"BootCurrent: 0003", "BootOrder: " + order, "Boot0002* UEFI Misc Device",
			"Boot0003* UEFI PXEv4 (MAC:525400311802)", "Boot0009* bcd: debian-stock.qcow2", "Boot000A* grub-install"}
		lines = append(lines, extra...)
		out := ""
		for _, l := range lines {
			out += "bcd-lab: efi: " + l + "\r\n"
		}
		return out + "bcd-lab: efi report end\r\n"
	}
	if r, err := checkEFIReport(report("0003,000A,0009,0002"), mac, "grub-install"); err != nil || r.bcdEntry != "0009" {
		t.Fatalf("%v %v", r, err)
	}
	for name, tc := range map[string]struct{ serial, second string }{
		"disk first":              {report("0002,0003,0009"), ""},
		"grub-install first":      {report("000A,0003,0009"), ""},
		"two bcd entries":         {report("0003,0009", "Boot000B* bcd: old"), ""},
		"grub-install not second": {report("0003,0009,000A"), "grub-install"},
		"no report":               {"bcd-lab: hostname: x\r\n", ""},
	} {
		if _, err := checkEFIReport(tc.serial, mac, tc.second); err == nil {
			t.Errorf("%s: passed", name)
		}
	}
	// The last report counts: an earlier good one does not hide a bad one.
	if _, err := checkEFIReport(report("0003,0009")+report("0002,0003,0009"), mac, ""); err == nil {
		t.Error("a bad last report passed")
	}
}
