package controlplane

import (
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/store/sqlite"
	"github.com/better-compute/bcd/protocol"
)

// TestServePrunesEvents: serve runs the pruner with its Retention: a node's
// events beyond the bound are gone within a few of its rounds.
func TestServePrunesEvents(t *testing.T) {
	dataDir := t.TempDir()
	s, _ := startServer(t, newPKI(t), dataDir, func(s *Server) {
		s.Retention = store.Retention{PerKind: 3, MaxTotal: 100}
		s.RetentionInterval = 20 * time.Millisecond
	})
	now := time.Now()
	var evs []store.Event
	for i := range 50 {
		evs = append(evs, store.Event{NodeID: "n_site", Seq: uint64(i + 1), Kind: protocol.EventBootNonce, Time: now, ReceivedAt: now})
	}
	if err := s.Store().AddEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", filepath.Join(dataDir, sqlite.DBFile)+"?_query_only=1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM events`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 3+1 { // the first and the latest three
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events left after 10 s of serve's pruner, want 4", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
