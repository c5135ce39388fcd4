package agent

import (
	"os"
	"strconv"
	"time"

	"github.com/better-compute/bcd/internal/buildmode"
	"github.com/better-compute/bcd/protocol"
)

// Environment variables that tune a fakehw development build for tests. A host
// build never reads them: buildmode.FakeHW is a constant false there, so the
// lookups are compiled out.
const (
	// EnvTestProtocolVersion replaces the protocol_version bcd says in Hello,
	// to play a daemon older than the gateway's minimum.
	EnvTestProtocolVersion = "BCD_TEST_PROTOCOL_VERSION"
	// EnvTestUpdateDeadline replaces self-update's 120 s confirm deadline (a
	// Go duration such as 5s).
	EnvTestUpdateDeadline = "BCD_TEST_UPDATE_DEADLINE"
	// EnvTestUpdateIdle replaces the download's idle timeout (a Go duration).
	EnvTestUpdateIdle = "BCD_TEST_UPDATE_IDLE"
)

// helloProtocolVersion is the protocol_version Hello carries.
func helloProtocolVersion() int {
	if buildmode.FakeHW {
		if v, err := strconv.Atoi(os.Getenv(EnvTestProtocolVersion)); err == nil && v > 0 {
			return v
		}
	}
	return protocol.Version
}

// TestDuration is the duration in the environment variable name in a fakehw
// build, and def otherwise (a host build, or a variable unset or not a
// positive Go duration).
func TestDuration(name string, def time.Duration) time.Duration {
	if buildmode.FakeHW {
		if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
			return d
		}
	}
	return def
}
