package operator

import (
	"testing"

	"github.com/better-compute/bcd/internal/deptest"
)

// TestOperatorCLILinksNoStore: the operator's commands reach the control
// plane through its api only; the store and SQLite are serve's, linked by
// package main.
func TestOperatorCLILinksNoStore(t *testing.T) {
	deptest.Forbid(t, ".", "",
		"modernc.org/", "database/sql", "github.com/better-compute/bcd/controlplane/store")
}
