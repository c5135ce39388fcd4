package apitype

import (
	"testing"

	"github.com/better-compute/bcd/internal/deptest"
)

// TestAPITypesStandAlone: the api's types import the wire vocabulary
// (protocol) and nothing of the control plane, so a store type cannot leak
// back into the api through them.
func TestAPITypesStandAlone(t *testing.T) {
	deptest.Forbid(t, ".", "", "github.com/better-compute/bcd/controlplane", "modernc.org/", "database/sql")
}
