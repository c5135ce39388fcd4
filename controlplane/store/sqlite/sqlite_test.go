package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/store/storetest"
	"github.com/better-compute/bcd/protocol"
)

var ctx = context.Background()

// TestConformance runs the store suite on a database in a temporary
// directory, a new one for each subtest.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "data"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

func TestOpenCreatesPrivateFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	for path, want := range map[string]os.FileMode{dir: 0o700, filepath.Join(dir, DBFile): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %o, want %o", path, got, want)
		}
	}
	// Reopening an up-to-date database migrates nothing and works.
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestMigrateFromVersion1(t *testing.T) {
	path := filepath.Join(t.TempDir(), DBFile)
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{schemaV1, "PRAGMA user_version = 1",
		`INSERT INTO sites (name, created_at) VALUES ('fsn1', 1)`,
		`INSERT INTO commands (id, node_id, kind, state, created_at, updated_at) VALUES ('cmd_1', 'n_a', 'node.reboot', 'PENDING', 1, 1)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	site, err := s.GetSite(ctx, "fsn1")
	if err != nil || site.Approval != store.ApprovalAuto || site.SpecRevision != 1 || site.HTTPProxy != nil {
		t.Errorf("migrated site %+v %v", site, err)
	}
	if c, err := s.GetCommand(ctx, "cmd_1"); err != nil || c.MachineID != "" {
		t.Errorf("migrated command %+v %v", c, err)
	}
	var v int
	s.(*sqliteStore).r.QueryRow("PRAGMA user_version").Scan(&v)
	if v != schemaVersion {
		t.Errorf("user_version %d, want %d", v, schemaVersion)
	}
}

func TestMigrateFromVersion2(t *testing.T) {
	path := filepath.Join(t.TempDir(), DBFile)
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{schemaV1, schemaV2, "PRAGMA user_version = 2",
		`INSERT INTO sites (name, created_at) VALUES ('fsn1', 1)`,
		`INSERT INTO machines (id, site, state, state_changed_at, created_at, updated_at) VALUES ('m_1', 'fsn1', 'registered', 1, 1, 1)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := s.GetMachine(ctx, "m_1")
	if err != nil || m.Firmware != store.FirmwareBIOS || m.Deployment != "" {
		t.Errorf("migrated machine %+v %v", m, err)
	}
	if ds, err := s.OpenDeployments(ctx); err != nil || len(ds) != 0 {
		t.Errorf("deployments %v %v", ds, err)
	}
}

// TestMigrateFromVersion4: a database of schema 4 gets TPM enrollments and
// pool policies, its machines none of either.
func TestMigrateFromVersion4(t *testing.T) {
	path := filepath.Join(t.TempDir(), DBFile)
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{schemaV1, schemaV2, schemaV3, schemaV4, "PRAGMA user_version = 4",
		`INSERT INTO sites (name, created_at) VALUES ('fsn1', 1)`,
		`INSERT INTO machines (id, site, state, state_changed_at, created_at, updated_at) VALUES ('m_1', 'fsn1', 'registered', 1, 1, 1)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if m, err := s.GetMachine(ctx, "m_1"); err != nil || m.TPMEKSHA256 != "" {
		t.Errorf("migrated machine %+v %v", m, err)
	}
	if es, err := s.ListTPMEnrollments(ctx); err != nil || len(es) != 0 {
		t.Errorf("enrollments %v %v", es, err)
	}
	if ps, err := s.ListPoolPolicies(ctx); err != nil || len(ps) != 0 {
		t.Errorf("pool policies %v %v", ps, err)
	}
}

// TestMigrateEKProven: a node from before tpm_ek_proven counts as proven
// when its EK is enrolled (the tpm attestor joined it, or could have), and
// not when its EK was only claimed.
func TestMigrateEKProven(t *testing.T) {
	ctx := context.Background()
	node := func(id, ek string) string {
		return fmt.Sprintf(`INSERT INTO nodes (id, role, site, pool, spiffe_id, claims, tpm_ek_sha256, cert_serial, cert_not_after, state,
			created_at, updated_at, joined_at) VALUES ('%s', 'node', 'fsn1', 'p', 'x', '{}', '%s', '%s', 1, 'ready', 1, 1, 1)`, id, ek, id)
	}
	s := openFromBefore(t, "schemaEKProven", schemaEKProven,
		`INSERT INTO sites (name, created_at) VALUES ('fsn1', 1)`,
		`INSERT INTO tpm_enrollments (ek_sha256, site, created_at) VALUES ('ek-enrolled', 'fsn1', 1)`,
		node("n_tpm", "ek-enrolled"), node("n_claimed", "ek-claimed"), node("n_none", ""))
	for id, want := range map[string]bool{"n_tpm": true, "n_claimed": false, "n_none": false} {
		n, err := s.GetNode(ctx, id)
		if err != nil || n.TPMEKProven != want {
			t.Errorf("migrated %s: proven %v %v, want %v", id, n.TPMEKProven, err, want)
		}
	}
}

// TestOpenRefusesNewerSchema: a database a newer build migrated is left
// alone, not opened by a build that does not know its schema.
func TestOpenRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), DBFile)
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", schemaVersion+1)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := OpenFile(path)
	if err == nil {
		s.Close()
		t.Fatal("a database of a newer schema was opened")
	}
	if want := fmt.Sprintf("schema version %d is newer than this build's %d", schemaVersion+1, schemaVersion); !strings.Contains(err.Error(), want) {
		t.Errorf("error %q, want it to say %q", err, want)
	}
}

// TestWAL: readers run beside the one writer because the database is in
// WAL mode, which the file keeps.
func TestWAL(t *testing.T) {
	path := filepath.Join(t.TempDir(), DBFile)
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var mode string
	if err := s.(*sqliteStore).r.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode %q %v, want wal", mode, err)
	}
}

func TestOpenFileRefusesURIParts(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"db?mode=ro", "db#x"} {
		path := filepath.Join(dir, name)
		if s, err := OpenFile(path); err == nil {
			s.Close()
			t.Errorf("OpenFile(%q) opened", name)
		}
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Errorf("OpenFile(%q) created the file: %v", name, err)
		}
	}
}

// TestMigrateImages: a database from before the image catalog gets its
// table at open, and keeps what it held.
func TestMigrateImages(t *testing.T) {
	ctx := context.Background()
	s := openFromBefore(t, "schemaImages", schemaImages, `INSERT INTO sites (name, created_at) VALUES ('fsn1', 1)`)
	if _, err := s.GetSite(ctx, "fsn1"); err != nil {
		t.Fatalf("the site after the migration: %v", err)
	}
	im := store.Image{Name: "os", Image: protocol.DeployImage{URL: "https://images.example.test/os.raw", SHA256: strings.Repeat("a", 64), Size: 1,
		Format: protocol.FormatRaw}, CreatedAt: time.UnixMilli(1).UTC()}
	if err := s.AddImage(ctx, im); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetImage(ctx, "os"); err != nil || got != im {
		t.Fatalf("GetImage after the migration: %+v %v", got, err)
	}
}

// openFromBefore builds a database as it was just before migration m (named
// name in failures), wherever later migrations put m, runs seed in it and opens
// it with OpenFile, which migrates it; the store closes with the test.
func openFromBefore(t *testing.T, name, m string, seed ...string) store.Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), DBFile)
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	before := slices.Index(migrations, m)
	if before < 0 {
		t.Fatalf("%s is not a migration", name)
	}
	qs := append(append(append([]string{}, migrations[:before]...), fmt.Sprintf("PRAGMA user_version = %d", before)), seed...)
	for _, q := range qs {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
