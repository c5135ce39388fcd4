package retention

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/join"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/store/sqlite"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

var ctx = context.Background()

// openStore opens a SQLite store with site cptest.Site and returns it with its
// data directory.
func openStore(t *testing.T) (store.Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	st, err := sqlite.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.CreateSite(ctx, store.Site{Name: cptest.Site, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return st, dir
}

// dbSize is the bytes of the database and its WAL.
func dbSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	for _, f := range []string{sqlite.DBFile, sqlite.DBFile + "-wal"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// count runs a COUNT query on the database in dir, beside the open store.
func count(t *testing.T, dir, query string) int {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(dir, sqlite.DBFile)+"?_query_only=1")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(ctx, query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBootNonceFloodIsPruned: 100,000 boot.nonce events for four machines, as a
// site agent relays a flood of script GETs, go through the gateway's ingest path
// (machines.Events, then the node's events) while the pruner runs its rounds. The
// database stays within the bound (rows and bytes), each machine's timeline keeps
// its first boot.nonce entry and its latest, and the newest nonce still joins.
func TestBootNonceFloodIsPruned(t *testing.T) {
	st, dir := openStore(t)
	macs := []string{"52:54:00:00:10:01", "52:54:00:00:10:02", "52:54:00:00:10:03", cptest.MAC}
	var ms []store.Machine
	for _, mac := range macs {
		ms = append(ms, cptest.NewMachine(t, st, func(m *store.Machine) { m.MACs = []string{mac} }))
	}
	// The site node whose key signs the newest nonce's witness at the end.
	site := store.Node{ID: cptest.EnsureSiteNode(t, st, cptest.Site), Role: protocol.RoleSite, Site: cptest.Site}
	const batch, perKind = 256, 1000
	// About 5 s on the 2-core machine, the ingest storing each batch in one
	// transaction (AddBootNonces); 27 s when every nonce had its own, its
	// statements parsed each time. -short floods a fifth.
	flood := 100_000
	if testing.Short() {
		flood = 20_000
	}
	start := time.Now().Add(-2 * time.Minute).UTC().Truncate(time.Millisecond)
	clock := start
	// The ingest reads its clock once per nonce: the i-th nonce is minted at
	// start + i ms.
	minted := 0
	evs := &machines.Events{Store: st, Now: func() time.Time {
		minted++
		return start.Add(time.Duration(minted-1) * time.Millisecond)
	}}
	policy := store.DefaultRetention()
	policy.PerKind = perKind
	p := &Pruner{Store: st, Policy: policy, Now: func() time.Time { return clock }}
	var newest string
	var peak int64
	for i := 0; i < flood; {
		var b []protocol.Event
		for ; len(b) < batch && i < flood; i++ {
			clock = start.Add(time.Duration(i) * time.Millisecond)
			nonce, err := protocol.NewBootNonce()
			if err != nil {
				t.Fatal(err)
			}
			if i%len(macs) == len(macs)-1 {
				newest = nonce // of cptest.MAC
			}
			data, _ := json.Marshal(protocol.BootNonce{MAC: macs[i%len(macs)], Nonce: nonce, ExpiresAt: clock.Add(30 * time.Minute)})
			b = append(b, protocol.Event{Seq: uint64(i + 1), Kind: protocol.EventBootNonce, Time: clock, Data: data})
		}
		// What the gateway's session does with a batch of a site agent's events.
		stored, err := evs.Events(ctx, site, b)
		if err != nil {
			t.Fatal(err)
		}
		rows := make([]store.Event, len(stored))
		for k, ev := range stored {
			rows[k] = store.Event{NodeID: site.ID, Seq: ev.Seq, Kind: ev.Kind, Time: ev.Time, Message: ev.Message, Data: ev.Data, ReceivedAt: clock}
		}
		if err := st.AddEvents(ctx, rows); err != nil {
			t.Fatal(err)
		}
		if i%(20*batch) < batch || i == flood { // a round every ~5,000 events, as the ticker would
			if _, err := p.Round(ctx); err != nil {
				t.Fatal(err)
			}
			peak = max(peak, dbSize(t, dir))
		}
	}
	for table, want := range map[string]int{
		"events":         perKind + 1,
		"machine_events": len(macs) * (perKind + 1 + 1), // each machine's machine.added too
		"boot_nonces":    len(macs) * store.DefaultNoncesPerMAC,
	} {
		if got := count(t, dir, `SELECT COUNT(*) FROM `+table); got > want {
			t.Errorf("%s holds %d rows after the flood, want at most %d", table, got, want)
		}
	}
	// Unpruned, the flood takes about 108 MB (21.7 MB at 20,000), nearly all
	// of it rows the bound does not keep; pruned, the file stays below this.
	const bound = 16 << 20
	if peak > bound {
		t.Errorf("the database reached %d bytes during the flood, want at most %d", peak, bound)
	}
	for k, m := range ms {
		tl, err := st.MachineEvents(ctx, m.ID, 10*perKind)
		if err != nil {
			t.Fatal(err)
		}
		var nonces []store.MachineEvent
		for _, e := range tl {
			if e.Kind == protocol.EventBootNonce {
				nonces = append(nonces, e)
			}
		}
		if len(nonces) != perKind+1 {
			t.Fatalf("machine %d: %d boot.nonce entries on the timeline, want %d", k, len(nonces), perKind+1)
		}
		first := start.Add(time.Duration(k) * time.Millisecond)
		last := start.Add(time.Duration(flood-len(macs)+k) * time.Millisecond)
		if !nonces[0].Time.Equal(first) || !nonces[len(nonces)-1].Time.Equal(last) {
			t.Errorf("machine %d: timeline's boot.nonce entries run %s to %s, want the storm's first %s and last %s", k,
				nonces[0].Time, nonces[len(nonces)-1].Time, first, last)
		}
		if tl[0].Kind != protocol.MachineEventAdded {
			t.Errorf("machine %d: the timeline starts with %s, want %s", k, tl[0].Kind, protocol.MachineEventAdded)
		}
	}
	// The ramdisk booted with the last script served joins on its nonce.
	b := cptest.NewBundle(t)
	svc := &join.Service{Bundle: b, Store: st, Attestors: map[string]join.Attestor{
		protocol.AttestorDiscovery: join.NewDiscoveryAttestor(st, join.TPMOptions{Bundle: b})}}
	a := cptest.NewAgent(t)
	req := a.DiscoveryRequest(newest, cptest.MAC)
	req.Site = cptest.Site
	req.Witness = cptest.SignWitness(cptest.SiteKey(), site.ID, newest, pki.CSRSHA256(a.CSRDER), cptest.MAC, nil)
	resp, err := svc.Join(ctx, req)
	if err != nil {
		t.Fatalf("the newest nonce does not join after the pruning: %v", err)
	}
	if res := a.Verify(t, b, resp); res.Role != protocol.RoleRamdisk {
		t.Errorf("joined as %s", res.Role)
	}
}

// TestPruneByAgeAndTotal: entries older than MaxAge go whatever the counts, and
// each table is cut to MaxTotal from its oldest; a waiting join's nonce outlives
// its MAC's count.
func TestPruneByAgeAndTotal(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		policy store.Retention
		// want: rows left in events, machine_events (machine.added included),
		// boot_nonces.
		want [3]int
	}{
		// The last 31 minutes' entries stay; machine.added, an hour old, goes.
		{"age", store.Retention{MaxAge: 30 * time.Minute}, [3]int{31, 31, 31}},
		{"total", store.Retention{MaxTotal: 25}, [3]int{25, 25, 25}},
		// The latest five and the one a join waits on.
		{"nonces per MAC", store.Retention{NoncesPerMAC: 5}, [3]int{60, 61, 5 + 1}},
		// The first and the latest ten of each kind.
		{"per kind", store.Retention{PerKind: 10}, [3]int{10 + 1, 10 + 1 + 1, 60}},
		{"all", store.DefaultRetention(), [3]int{60, 61, store.DefaultNoncesPerMAC + 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, dir := openStore(t)
			m := cptest.NewMachine(t, st, func(m *store.Machine) { m.CreatedAt = now.Add(-time.Hour) })
			var deferred store.BootNonce
			for i := range 60 { // one a minute for the last hour
				at := now.Add(time.Duration(i-59) * time.Minute)
				if err := st.AddEvent(ctx, store.Event{NodeID: "n_site", Kind: protocol.EventBootNonce, Time: at, ReceivedAt: at}); err != nil {
					t.Fatal(err)
				}
				n := store.BootNonce{MAC: cptest.MAC, Site: cptest.Site, SiteNode: "n_site", MachineID: m.ID, CreatedAt: at,
					ExpiresAt: now.Add(time.Hour), Event: &store.MachineEvent{MachineID: m.ID, Time: at, Kind: protocol.EventBootNonce}}
				copy(n.Hash[:], fmt.Sprintf("nonce %026d", i))
				if _, err := st.AddBootNonce(ctx, n); err != nil {
					t.Fatal(err)
				}
				if i == 40 {
					deferred = n
				}
			}
			if _, err := st.DeferBootNonce(ctx, deferred.Hash, "csr", now); err != nil {
				t.Fatal(err)
			}
			p := &Pruner{Store: st, Policy: tc.policy, Batch: 7, Now: func() time.Time { return now }}
			if _, err := p.Round(ctx); err != nil {
				t.Fatal(err)
			}
			got := [3]int{count(t, dir, `SELECT COUNT(*) FROM events`), count(t, dir, `SELECT COUNT(*) FROM machine_events`),
				count(t, dir, `SELECT COUNT(*) FROM boot_nonces`)}
			if got != tc.want {
				t.Errorf("rows left (events, machine_events, boot_nonces) = %v, want %v", got, tc.want)
			}
			if again, err := p.Round(ctx); err != nil || again.Total() != 0 {
				t.Errorf("a second round pruned %+v (%v), want nothing", again, err)
			}
		})
	}
}
