package client

import (
	"testing"

	"github.com/better-compute/bcd/internal/deptest"
)

// TestClientLinksNoStore: the operator's client talks to the api and
// needs none of the store or its database; a program that imports it (the
// CLI, a script's helper) stays small and free of cgo-less SQLite.
func TestClientLinksNoStore(t *testing.T) {
	deptest.Forbid(t, ".", "",
		"modernc.org/", "database/sql", "github.com/better-compute/bcd/controlplane/store")
}
