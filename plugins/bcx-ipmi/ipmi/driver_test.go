//go:build linux

package ipmi

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/testbed"
)

// silentBMC listens on loopback like a BMC and never answers.
func silentBMC(t *testing.T) bmc.Host {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
	return bmc.Host{Name: "silent", Address: "127.0.0.1", Port: pc.LocalAddr().(*net.UDPAddr).Port, Username: "admin", Password: "pw", CipherSuite: 3}
}

func TestSilentBMCIsUnreachable(t *testing.T) {
	d := &Driver{Timeout: 100 * time.Millisecond, Retries: 1, Attempts: 2, Backoff: 50 * time.Millisecond}
	h := silentBMC(t)
	start := time.Now()
	_, err := d.PowerStatus(context.Background(), h)
	if bmc.KindOf(err) != bmc.KindUnreachable || !strings.Contains(err.Error(), "silent (127.0.0.1:") {
		t.Fatalf("%v (kind %s)", err, bmc.KindOf(err))
	}
	// Two sessions of two tries of 100 ms, and a backoff.
	if el := time.Since(start); el < 400*time.Millisecond || el > 3*time.Second {
		t.Errorf("took %s", el)
	}
	// A deadline shorter than the retries ends the call at the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	d = &Driver{Timeout: time.Second, MinInterval: -1}
	start = time.Now()
	if _, err := d.PowerStatus(ctx, h); bmc.KindOf(err) != bmc.KindUnreachable {
		t.Errorf("with a deadline: %v", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Errorf("the deadline was not kept: %s", el)
	}
}

func TestInvalidHosts(t *testing.T) {
	d := &Driver{}
	for _, h := range []bmc.Host{
		{Name: "a", Username: "u"},
		{Name: "b", Address: "127.0.0.1", Username: "u", CipherSuite: 1},
		{Name: "c", Address: "127.0.0.1"},
		{Name: "d", Address: "127.0.0.1", Username: strings.Repeat("u", 17)},
	} {
		if _, err := d.PowerStatus(context.Background(), h); bmc.KindOf(err) != bmc.KindInvalid {
			t.Errorf("%s: %v (kind %s)", h.Name, err, bmc.KindOf(err))
		}
	}
	if err := d.SetBootDevice(context.Background(), silentBMC(t), bmc.BootDevice{Device: "usb"}); bmc.KindOf(err) != bmc.KindInvalid {
		t.Errorf("boot device usb: %v", err)
	}
}

// TestOneOperationAtATimePerBMC: calls to one BMC wait for each other; calls to
// different BMCs do not.
func TestOneOperationAtATimePerBMC(t *testing.T) {
	d := &Driver{Timeout: 300 * time.Millisecond, Retries: -1, Attempts: 1, MinInterval: -1}
	a, b := silentBMC(t), silentBMC(t)
	run := func(hosts ...bmc.Host) time.Duration {
		var wg sync.WaitGroup
		start := time.Now()
		for _, h := range hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.PowerStatus(context.Background(), h)
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	if el := run(a, a); el < 550*time.Millisecond {
		t.Errorf("two calls to one BMC overlapped: %s", el)
	}
	if el := run(a, b); el > 550*time.Millisecond {
		t.Errorf("calls to two BMCs waited for each other: %s", el)
	}
}

// simBMC runs OpenIPMI's ipmi_sim on loopback, as the testbed's virtual BMC.
func simBMC(t *testing.T) (*testbed.VBMC, bmc.Host) {
	t.Helper()
	testenv.NeedTool(t, "ipmi_sim")
	testenv.NeedTool(t, "ipmitool")
	port := 17000 + os.Getpid()%1000
	v := &testbed.VBMC{Name: "sim", Dir: filepath.Join(t.TempDir(), "bmc"), Port: port, Password: "Sim-pw-31"}
	if err := v.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Stop)
	return v, bmc.Host{Name: "sim", Address: "127.0.0.1", Port: port, Username: "admin", Password: "Sim-pw-31", CipherSuite: 3}
}

func TestAgainstIPMISim(t *testing.T) {
	v, h := simBMC(t)
	d := &Driver{MinInterval: -1}
	ctx := context.Background()
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, v.Tail(10))
		}
	}
	p, err := d.PowerStatus(ctx, h)
	must("status", err)
	if p != bmc.PowerOff {
		t.Errorf("fresh machine is %s", p)
	}
	must("on", d.PowerOn(ctx, h))
	if p, _ := d.PowerStatus(ctx, h); p != bmc.PowerOn {
		t.Errorf("after on: %s", p)
	}
	must("reset", d.PowerReset(ctx, h))
	must("off", d.PowerOff(ctx, h))
	if p, _ := d.PowerStatus(ctx, h); p != bmc.PowerOff {
		t.Errorf("after off: %s", p)
	}
	// A cycle of a machine that is off powers it on.
	must("cycle", d.PowerCycle(ctx, h))
	if p, _ := d.PowerStatus(ctx, h); p != bmc.PowerOn {
		t.Errorf("after cycle from off: %s", p)
	}
	must("bootdev pxe", d.SetBootDevice(ctx, h, bmc.BootDevice{Device: bmc.DevicePXE, EFI: true, Persistent: true}))
	if v.BootDevice() != "pxe" {
		t.Errorf("boot device %q", v.BootDevice())
	}
	must("bootdev disk", d.SetBootDevice(ctx, h, bmc.BootDevice{Device: bmc.DeviceDisk}))
	if v.BootDevice() != "default" {
		t.Errorf("boot device %q", v.BootDevice())
	}
	inv, err := d.Inventory(ctx, h)
	must("inventory", err)
	if inv.ManufacturerID != 4753 || inv.ProductID != 0xf02 || inv.FirmwareRevision != "9.08" || inv.Power != bmc.PowerOn {
		t.Errorf("inventory %+v", inv)
	}
	calls := v.Calls()
	for _, want := range []string{"set power 1", "set reset 1", "set power 0", "set boot pxe", "set boot default"} {
		if !strings.Contains(calls, want) {
			t.Errorf("the BMC never saw %q:\n%s", want, calls)
		}
	}

	// Refused logins are auth errors, at once, and name no password.
	for _, bad := range []bmc.Host{
		{Name: "sim", Address: h.Address, Port: h.Port, Username: "admin", Password: "wrong-pw-77", CipherSuite: 3},
		{Name: "sim", Address: h.Address, Port: h.Port, Username: "nobody", Password: "Sim-pw-31", CipherSuite: 3},
	} {
		start := time.Now()
		_, err := d.PowerStatus(ctx, bad)
		if bmc.KindOf(err) != bmc.KindAuth || strings.Contains(err.Error(), string(bad.Password)) {
			t.Errorf("user %s: %v (kind %s)", bad.Username, err, bmc.KindOf(err))
		}
		if time.Since(start) > 3*time.Second {
			t.Errorf("user %s: a refused login was retried (%s)", bad.Username, time.Since(start))
		}
	}

	// ipmi_sim only speaks suite 3; letting the client choose finds it.
	auto := h
	auto.CipherSuite = 0
	if _, err := d.PowerStatus(ctx, auto); err != nil {
		t.Errorf("automatic cipher suite: %v", err)
	}
	suite17 := h
	suite17.CipherSuite = 17
	_, err = d.PowerStatus(ctx, suite17)
	t.Logf("cipher suite 17 against ipmi_sim: %v (kind %s)", err, bmc.KindOf(err))
}

func TestMinIntervalPacesOneBMC(t *testing.T) {
	_, h := simBMC(t)
	d := &Driver{MinInterval: 400 * time.Millisecond}
	ctx := context.Background()
	if _, err := d.PowerStatus(ctx, h); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := d.PowerStatus(ctx, h); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 350*time.Millisecond {
		t.Errorf("the second call came %s after the first", el)
	}
}

// lossyProxy forwards datagrams between the driver and a BMC, counting the
// driver's, and stops forwarding after the first n.
type lossyProxy struct {
	sent atomic.Int32
	n    int32
}

func (p *lossyProxy) start(t *testing.T, bmcAddr string) int {
	t.Helper()
	front, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	back, err := net.Dial("udp", bmcAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { back.Close() })
	var client atomic.Value
	go func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := front.ReadFrom(buf)
			if err != nil {
				return
			}
			client.Store(from)
			if p.sent.Add(1) <= p.n {
				back.Write(buf[:n])
			}
		}
	}()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := back.Read(buf)
			if err != nil {
				return
			}
			if to, ok := client.Load().(net.Addr); ok {
				front.WriteTo(buf[:n], to)
			}
		}
	}()
	return front.LocalAddr().(*net.UDPAddr).Port
}

// TestCycleIsNotResent: when the answer to a cycle is lost, the driver does not
// send it again (that could cycle the machine twice) and says the outcome is
// unknown; an idempotent operation whose answer is lost opens another session.
func TestCycleIsNotResent(t *testing.T) {
	v, h := simBMC(t)
	d := &Driver{Timeout: 200 * time.Millisecond, Retries: -1, Attempts: 3, Backoff: 50 * time.Millisecond, MinInterval: -1}
	ctx := context.Background()
	if err := d.PowerOn(ctx, h); err != nil {
		t.Fatal(err)
	}
	// Count what one power status takes, session setup included.
	count := &lossyProxy{n: 1000}
	via := h
	via.Port = count.start(t, v.Addr())
	if _, err := d.PowerStatus(ctx, via); err != nil {
		t.Fatal(err)
	}
	// A session's setup, the status, and the session's close.
	perStatus := count.sent.Load()

	// A cycle sends the setup and the status, then its chassis control: drop that,
	// and what follows.
	drop := &lossyProxy{n: perStatus - 1}
	via.Port = drop.start(t, v.Addr())
	err := d.PowerCycle(ctx, via)
	if bmc.KindOf(err) != bmc.KindUnreachable || !strings.Contains(err.Error(), "not resent: whether the BMC carried out power cycle is unknown") {
		t.Fatalf("cycle with its answer lost: %v", err)
	}
	// One session only: at most the session close follows the lost command.
	if got := drop.sent.Load(); got > perStatus+1 {
		t.Errorf("the driver sent %d datagrams for one cycle (a status takes %d): it retried", got, perStatus)
	}

	// The same loss for power on: another session, which the proxy also starves.
	drop = &lossyProxy{n: perStatus - 2}
	via.Port = drop.start(t, v.Addr())
	if err := d.PowerOn(ctx, via); bmc.KindOf(err) != bmc.KindUnreachable {
		t.Fatalf("on with its answer lost: %v", err)
	}
	if got := drop.sent.Load(); got <= perStatus {
		t.Errorf("power on was not retried in a new session (%d datagrams)", got)
	}
}
