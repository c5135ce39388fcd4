package bmcplugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/go-plugin"

	"github.com/better-compute/bcd/bmc"
)

// fakeDriver records what reached it and answers from its fields.
type fakeDriver struct {
	mu    sync.Mutex
	calls []string
	hosts []bmc.Host
	boot  bmc.BootDevice
	power bmc.PowerState
	inv   bmc.Inventory
	err   error
	block chan struct{} // when set, calls wait for it or their context
}

func (f *fakeDriver) record(ctx context.Context, op string, h bmc.Host) error {
	f.mu.Lock()
	f.calls = append(f.calls, op)
	f.hosts = append(f.hosts, h)
	block, err := f.block, f.err
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

func (f *fakeDriver) PowerStatus(ctx context.Context, h bmc.Host) (bmc.PowerState, error) {
	return f.power, f.record(ctx, "PowerStatus", h)
}
func (f *fakeDriver) PowerOn(ctx context.Context, h bmc.Host) error {
	return f.record(ctx, "PowerOn", h)
}
func (f *fakeDriver) PowerOff(ctx context.Context, h bmc.Host) error {
	return f.record(ctx, "PowerOff", h)
}
func (f *fakeDriver) PowerCycle(ctx context.Context, h bmc.Host) error {
	return f.record(ctx, "PowerCycle", h)
}
func (f *fakeDriver) PowerReset(ctx context.Context, h bmc.Host) error {
	return f.record(ctx, "PowerReset", h)
}
func (f *fakeDriver) SetBootDevice(ctx context.Context, h bmc.Host, d bmc.BootDevice) error {
	f.mu.Lock()
	f.boot = d
	f.mu.Unlock()
	return f.record(ctx, "SetBootDevice", h)
}
func (f *fakeDriver) Inventory(ctx context.Context, h bmc.Host) (bmc.Inventory, error) {
	return f.inv, f.record(ctx, "Inventory", h)
}

// dispense connects a client to a server serving impl in this process, the way
// go-plugin's testing.go allows, over a real gRPC connection on a unix socket.
func dispense(t *testing.T, impl bmc.Driver) bmc.Driver {
	t.Helper()
	client, server := plugin.TestPluginGRPCConn(t, false, PluginMap(impl))
	// Closing the client shuts the server down through go-plugin's controller;
	// stopping it here as well would race with that.
	t.Cleanup(func() { client.Close() })
	_ = server
	raw, err := client.Dispense(Name)
	if err != nil {
		t.Fatal(err)
	}
	d, ok := raw.(bmc.Driver)
	if !ok {
		t.Fatalf("dispensed %T, not a bmc.Driver", raw)
	}
	return d
}

var testHost = bmc.Host{Name: "m-1", Address: "192.0.2.10", Port: 6230, Username: "admin",
	Password: "s3cr3t-pw", CipherSuite: 3}

func TestEveryCallRoundTrips(t *testing.T) {
	f := &fakeDriver{power: bmc.PowerOn, inv: bmc.Inventory{Power: bmc.PowerOn, ManufacturerID: 4753,
		ProductID: 0xf02, FirmwareRevision: "9.08", SystemGUID: "efcdab89-6745-23a1-efcd-ab89674523a1"}}
	d := dispense(t, f)
	ctx := context.Background()

	p, err := d.PowerStatus(ctx, testHost)
	if err != nil || p != bmc.PowerOn {
		t.Fatalf("PowerStatus = %q, %v", p, err)
	}
	for name, call := range map[string]func(context.Context, bmc.Host) error{
		"PowerOn": d.PowerOn, "PowerOff": d.PowerOff, "PowerCycle": d.PowerCycle, "PowerReset": d.PowerReset,
	} {
		if err := call(ctx, testHost); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	want := bmc.BootDevice{Device: bmc.DevicePXE, EFI: true, Persistent: true}
	if err := d.SetBootDevice(ctx, testHost, want); err != nil {
		t.Fatal(err)
	}
	inv, err := d.Inventory(ctx, testHost)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(f.inv, inv); diff != "" {
		t.Errorf("inventory (-sent +received):\n%s", diff)
	}
	if diff := cmp.Diff(want, f.boot); diff != "" {
		t.Errorf("boot device (-sent +received):\n%s", diff)
	}
	if len(f.calls) != 7 {
		t.Errorf("driver saw %v, want 7 calls", f.calls)
	}
	// The credentials reach the plugin intact: this channel is how they travel.
	for _, h := range f.hosts {
		if string(h.Password) != string(testHost.Password) || h.Username != testHost.Username ||
			h.Addr() != testHost.Addr() || h.CipherSuite != 3 || h.Name != "m-1" {
			t.Fatalf("plugin received host %s user %q suite %d, password intact %v", h, h.Username, h.CipherSuite,
				string(h.Password) == string(testHost.Password))
		}
	}
}

func TestErrorKindsCrossTheChannel(t *testing.T) {
	for _, kind := range []bmc.Kind{bmc.KindInvalid, bmc.KindUnsupported, bmc.KindUnreachable, bmc.KindAuth, bmc.KindBMC, bmc.KindInternal} {
		f := &fakeDriver{err: bmc.Errorf(kind, "bmc %s said no", testHost)}
		d := dispense(t, f)
		err := d.PowerOff(context.Background(), testHost)
		if got := bmc.KindOf(err); got != kind {
			t.Errorf("kind %s came back as %s (%v)", kind, got, err)
		}
		if err == nil || !strings.Contains(err.Error(), "said no") {
			t.Errorf("kind %s: message lost: %v", kind, err)
		}
	}
	// An error without a kind is internal, not a plugin failure.
	d := dispense(t, &fakeDriver{err: errors.New("plain")})
	if k := bmc.KindOf(d.PowerOn(context.Background(), testHost)); k != bmc.KindInternal {
		t.Errorf("plain error came back as %s", k)
	}
}

func TestDeadlineReachesThePlugin(t *testing.T) {
	f := &fakeDriver{block: make(chan struct{})}
	d := dispense(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := d.PowerCycle(ctx, testHost)
	if err == nil {
		t.Fatal("a blocked call succeeded")
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the call outlived its deadline by %s", time.Since(start))
	}
}

func TestFormattingHidesThePassword(t *testing.T) {
	for _, s := range []string{
		testHost.String(), fmt.Sprintf("%v", testHost), fmt.Sprintf("%+v", testHost), fmt.Sprintf("%#v", testHost),
		fmt.Sprintf("%s", testHost.Password), fmt.Sprintf("%q", testHost.Password), fmt.Sprintf("%x", testHost.Password),
		fmt.Sprintf("%v", struct{ H bmc.Host }{testHost}), fmt.Sprintf("%+v", &testHost),
	} {
		if strings.Contains(s, "s3cr3t") || strings.Contains(s, "73336372337") {
			t.Errorf("formatted host shows the password: %s", s)
		}
	}
}
