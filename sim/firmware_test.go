package sim

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/spawn"
)

// firmwareChildEnv makes this test binary the firmware child (bcd sim firmware).
const firmwareChildEnv = "BCD_SIM_TEST_FIRMWARE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(firmwareChildEnv) == "1" {
		if err := FirmwareMain(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestFirmwareChild: the machines' firmware runs in a child process at sim's nice
// value − 10 (so sim's own work does not delay its timers), answers a boot by its
// id, says why a machine's address does not bind, and ends when sim closes its
// stdin.
func TestFirmwareChild(t *testing.T) {
	t.Setenv(firmwareChildEnv, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := &fleet{ctx: ctx}
	p, err := startFirmware(ctx, f, []string{os.Args[0]})
	if err != nil {
		t.Fatal(err)
	}
	own, err := spawn.Nice(0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := spawn.Nice(p.pid())
	if err != nil {
		t.Fatal(err)
	}
	if want := max(own+FirmwareNice, -20); got != want {
		if os.Geteuid() != 0 {
			t.Logf("not root: the child runs at nice %d, sim's own", got)
		} else {
			t.Errorf("the firmware child's nice is %d, want %d (sim's %d %+d)", got, want, own, FirmwareNice)
		}
	}
	if got == own && os.Getpid() == p.pid() {
		t.Fatal("the firmware runs in sim's own process")
	}
	a, err := p.boot(ctx, 3)
	if err != nil || !strings.Contains(a.Err, "no machine 3 (0 machines)") {
		t.Errorf("boot of a machine the child does not have = %+v, %v; want its error", a, err)
	}
	p.stop()
	select {
	case <-p.done:
	default:
		t.Fatal("the child did not end with its stdin")
	}
	if _, err := p.boot(ctx, 0); err == nil || !strings.Contains(err.Error(), "the firmware child ended") {
		t.Errorf("boot after the child ended: %v, want that it ended", err)
	}

	// A machine address that is not this host's (TEST-NET-1).
	f.machines = []*machine{{name: "sim-00000", mac: net.HardwareAddr{2, 0, 0, 0, 0, 1}, ip: netip.MustParseAddr("192.0.2.77"), fw: FirmwareBIOS}}
	if _, err := startFirmware(ctx, f, []string{os.Args[0]}); err == nil || !strings.Contains(err.Error(), "machine sim-00000's address 192.0.2.77 (is it on sim's interface?)") {
		t.Errorf("startFirmware with a foreign address: %v, want the address named", err)
	}
}
