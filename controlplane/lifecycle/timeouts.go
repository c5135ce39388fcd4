package lifecycle

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/better-compute/bcd/internal/human"
)

// Timeouts bound each step of the lifecycle. A zero field means its default.
type Timeouts struct {
	// BMC is how long a bmc.bootdev or bmc.power has for its terminal
	// status, and how long the controller waits for a connected site agent
	// to send it to.
	BMC time.Duration
	// Ramdisk is how long the ramdisk has to join, and connect, after a
	// power cycle.
	Ramdisk time.Duration
	// Inventory is how long the deploy waits for the ramdisk's inventory.
	Inventory time.Duration
	// Deploy is how long deploy.image has from being sent to its terminal
	// status.
	Deploy time.Duration
	// Install is how long the installed OS has, after deploy.image
	// SUCCEEDED, to join as its node and be welcomed.
	Install time.Duration
	// Grace is how long a ramdisk whose session closed may take to come
	// back (a gateway restart) before it counts as gone.
	Grace time.Duration
}

// Defaults of Timeouts, sized for a VM under TCG: a PXE boot to a joined
// ramdisk takes minutes there.
const (
	DefaultBMCTimeout       = 2 * time.Minute
	DefaultRamdiskTimeout   = 10 * time.Minute
	DefaultInventoryTimeout = 2 * time.Minute
	DefaultDeployTimeout    = time.Hour
	DefaultInstallTimeout   = 15 * time.Minute
	DefaultGrace            = time.Minute
)

// maxTimeout bounds every timeout: a step that waits longer is stuck.
const maxTimeout = 24 * time.Hour

// EnvTimeouts is where serve reads ParseTimeouts' syntax when its flag is
// not given.
const EnvTimeouts = "BETTER_COMPUTE_LIFECYCLE_TIMEOUTS"

// WithDefaults returns t with every zero field set to its default.
func (t Timeouts) WithDefaults() Timeouts {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&t.BMC, DefaultBMCTimeout)
	def(&t.Ramdisk, DefaultRamdiskTimeout)
	def(&t.Inventory, DefaultInventoryTimeout)
	def(&t.Deploy, DefaultDeployTimeout)
	def(&t.Install, DefaultInstallTimeout)
	def(&t.Grace, DefaultGrace)
	return t
}

func (t *Timeouts) fields() map[string]*time.Duration {
	return map[string]*time.Duration{
		"bmc": &t.BMC, "ramdisk": &t.Ramdisk, "inventory": &t.Inventory,
		"deploy": &t.Deploy, "install": &t.Install, "grace": &t.Grace,
	}
}

// String renders t as ParseTimeouts reads it, every key in order.
func (t Timeouts) String() string {
	f := t.fields()
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+f[k].String())
	}
	return strings.Join(parts, ",")
}

// ParseTimeouts reads "ramdisk=10m,deploy=45m,…": comma-separated key=duration
// pairs with keys bmc, ramdisk, inventory, deploy, install and grace, each a
// Go duration above zero and at most 24h, each key at most once. Keys left
// out keep their default (a zero field). "" is all defaults.
func ParseTimeouts(s string) (Timeouts, error) {
	var t Timeouts
	if strings.TrimSpace(s) == "" {
		return t, nil
	}
	fields := t.fields()
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		key, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" {
			return Timeouts{}, fmt.Errorf("lifecycle timeouts: %q: want key=duration (keys bmc, ramdisk, inventory, deploy, install, grace)", human.Short(part))
		}
		dst, known := fields[key]
		if !known {
			return Timeouts{}, fmt.Errorf("lifecycle timeouts: unknown key %q (want bmc, ramdisk, inventory, deploy, install or grace)", human.Short(key))
		}
		if seen[key] {
			return Timeouts{}, fmt.Errorf("lifecycle timeouts: %s given twice", key)
		}
		seen[key] = true
		d, err := time.ParseDuration(strings.TrimSpace(val))
		if err != nil {
			return Timeouts{}, fmt.Errorf("lifecycle timeouts: %s: %q is not a duration such as 90s or 10m", key, human.Short(val))
		}
		if d <= 0 || d > maxTimeout {
			return Timeouts{}, fmt.Errorf("lifecycle timeouts: %s=%s: want more than 0 and at most %s", key, d, maxTimeout)
		}
		*dst = d
	}
	return t, nil
}

// short cuts a value quoted back in an error; human owns how.
