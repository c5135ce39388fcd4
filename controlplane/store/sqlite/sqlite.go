package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/secretfile"

	_ "modernc.org/sqlite" // the pure Go SQLite driver, registered as "sqlite"
)

// DBFile is the database's name in the data directory.
const DBFile = "better-compute.db"

// migrations bring a database from PRAGMA user_version i to i+1; a new
// database runs them all. Each is append-only: a released migration is
// never edited.
var migrations = []string{schemaV1, schemaV2, schemaV3, schemaV4, schemaV5, schemaV6, schemaV7, schemaV8,
	schemaRetention, schemaEKProven, schemaImages, schemaProvenEK}

// schemaVersion is PRAGMA user_version of a database this build has migrated.
var schemaVersion = len(migrations)

const schemaV1 = `
CREATE TABLE sites (
	name       TEXT PRIMARY KEY,
	created_at INTEGER NOT NULL
);
CREATE TABLE join_tokens (
	id            TEXT PRIMARY KEY,
	hash          BLOB NOT NULL,
	pool          TEXT NOT NULL,
	site          TEXT NOT NULL REFERENCES sites(name),
	role          TEXT NOT NULL,
	node_id       TEXT NOT NULL DEFAULT '',
	allow_reclaim INTEGER NOT NULL DEFAULT 0,
	created_at    INTEGER NOT NULL,
	expires_at    INTEGER NOT NULL,
	used_at       INTEGER,
	used_by       TEXT NOT NULL DEFAULT '',
	revoked_at    INTEGER
);
CREATE TABLE nodes (
	id             TEXT PRIMARY KEY,
	role           TEXT NOT NULL,
	site           TEXT NOT NULL,
	pool           TEXT NOT NULL,
	spiffe_id      TEXT NOT NULL,
	claims         TEXT NOT NULL,
	system_uuid    TEXT NOT NULL DEFAULT '',
	tpm_ek_sha256  TEXT NOT NULL DEFAULT '',
	cert_serial    TEXT NOT NULL,
	cert_not_after INTEGER NOT NULL,
	state          TEXT NOT NULL,
	cordoned       INTEGER NOT NULL DEFAULT 0,
	created_at     INTEGER NOT NULL,
	updated_at     INTEGER NOT NULL,
	joined_at      INTEGER NOT NULL,
	deleted_at     INTEGER,
	session_id     INTEGER,
	daemon_version TEXT NOT NULL DEFAULT '',
	last_seen_at   INTEGER,
	spec_revision  INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX nodes_system_uuid ON nodes(system_uuid) WHERE system_uuid != '' AND deleted_at IS NULL;
CREATE INDEX nodes_tpm_ek ON nodes(tpm_ek_sha256) WHERE tpm_ek_sha256 != '' AND deleted_at IS NULL;
CREATE TABLE node_sessions (
	id               INTEGER PRIMARY KEY,
	node_id          TEXT NOT NULL,
	role             TEXT NOT NULL,
	daemon_version   TEXT NOT NULL,
	boot_id          TEXT NOT NULL,
	protocol_version INTEGER NOT NULL,
	remote_addr      TEXT NOT NULL,
	connected_at     INTEGER NOT NULL,
	disconnected_at  INTEGER
);
CREATE INDEX node_sessions_node ON node_sessions(node_id, id);
CREATE INDEX node_sessions_open ON node_sessions(id) WHERE disconnected_at IS NULL;
CREATE TABLE commands (
	id         TEXT PRIMARY KEY,
	node_id    TEXT NOT NULL,
	kind       TEXT NOT NULL,
	params     TEXT,
	state      TEXT NOT NULL,
	reason     TEXT NOT NULL DEFAULT '',
	message    TEXT NOT NULL DEFAULT '',
	progress   TEXT,
	result     TEXT,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	sent_at    INTEGER
);
CREATE INDEX commands_open ON commands(node_id, id) WHERE state NOT IN ('SUCCEEDED', 'FAILED', 'UNSUPPORTED');
CREATE TABLE events (
	id          INTEGER PRIMARY KEY,
	node_id     TEXT NOT NULL,
	session_id  INTEGER,
	seq         INTEGER NOT NULL,
	kind        TEXT NOT NULL,
	time        INTEGER NOT NULL,
	level       TEXT NOT NULL DEFAULT '',
	message     TEXT NOT NULL DEFAULT '',
	data        TEXT,
	received_at INTEGER NOT NULL
);
CREATE INDEX events_node ON events(node_id, id);
CREATE TABLE operator_tokens (
	id         INTEGER PRIMARY KEY,
	hash       BLOB NOT NULL UNIQUE,
	created_at INTEGER NOT NULL
);
`

// schemaV2 adds machines, their MACs and timelines, boot nonces, and the
// site's approval policy, proxy and spec revision.
const schemaV2 = `
ALTER TABLE sites ADD COLUMN auto_approve INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sites ADD COLUMN http_proxy TEXT;
ALTER TABLE sites ADD COLUMN spec_revision INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sites ADD COLUMN updated_at INTEGER;
ALTER TABLE join_tokens ADD COLUMN machine_id TEXT NOT NULL DEFAULT '';
ALTER TABLE commands ADD COLUMN machine_id TEXT NOT NULL DEFAULT '';
CREATE TABLE machines (
	id               TEXT PRIMARY KEY,
	name             TEXT,
	site             TEXT NOT NULL REFERENCES sites(name),
	boot_mode        TEXT NOT NULL DEFAULT '',
	bmc_address      TEXT NOT NULL DEFAULT '',
	bmc_port         INTEGER NOT NULL DEFAULT 0,
	bmc_username     TEXT NOT NULL DEFAULT '',
	bmc_password     TEXT NOT NULL DEFAULT '',
	bmc_cipher_suite INTEGER NOT NULL DEFAULT 0,
	state            TEXT NOT NULL,
	state_reason     TEXT NOT NULL DEFAULT '',
	state_changed_at INTEGER NOT NULL,
	ramdisk_node     TEXT NOT NULL DEFAULT '',
	node             TEXT NOT NULL DEFAULT '',
	inventory        TEXT,
	inventory_at     INTEGER,
	approved         INTEGER NOT NULL DEFAULT 0,
	last_boot_stage  TEXT NOT NULL DEFAULT '',
	last_boot_at     INTEGER,
	created_at       INTEGER NOT NULL,
	updated_at       INTEGER NOT NULL
);
CREATE UNIQUE INDEX machines_site_name ON machines(site, name) WHERE name IS NOT NULL;
CREATE INDEX machines_name ON machines(name) WHERE name IS NOT NULL;
CREATE TABLE machine_macs (
	mac        TEXT PRIMARY KEY,
	machine_id TEXT NOT NULL REFERENCES machines(id) ON DELETE CASCADE
);
CREATE INDEX machine_macs_machine ON machine_macs(machine_id);
CREATE TABLE machine_events (
	id         INTEGER PRIMARY KEY,
	machine_id TEXT NOT NULL,
	time       INTEGER NOT NULL,
	kind       TEXT NOT NULL,
	message    TEXT NOT NULL DEFAULT '',
	node_id    TEXT NOT NULL DEFAULT '',
	command_id TEXT NOT NULL DEFAULT '',
	data       TEXT
);
CREATE INDEX machine_events_machine ON machine_events(machine_id, id);
CREATE INDEX machine_events_command ON machine_events(command_id, id) WHERE command_id != '';
CREATE TABLE boot_nonces (
	hash        BLOB PRIMARY KEY,
	mac         TEXT NOT NULL,
	site        TEXT NOT NULL,
	site_node   TEXT NOT NULL,
	machine_id  TEXT NOT NULL DEFAULT '',
	created_at  INTEGER NOT NULL,
	expires_at  INTEGER NOT NULL,
	csr_sha256  TEXT NOT NULL DEFAULT '',
	deferred_at INTEGER,
	used_at     INTEGER,
	used_by     TEXT NOT NULL DEFAULT ''
);
CREATE INDEX boot_nonces_expiry ON boot_nonces(expires_at);
`

// schemaV4 splits a machine's record by owner: boot_override is the
// operator's (spec; boot_mode stays the lifecycle's), bound_ramdisk,
// bound_node and bind_seq are the JoinService's observations, which the
// lifecycle adopts into ramdisk_node and node (bind_applied: the bind_seq it
// adopted); a deployment's ramdisk in use and the one it left behind get a
// column each.
const schemaV4 = `
ALTER TABLE machines ADD COLUMN boot_override TEXT NOT NULL DEFAULT '';
ALTER TABLE machines ADD COLUMN bound_ramdisk TEXT NOT NULL DEFAULT '';
ALTER TABLE machines ADD COLUMN bound_node TEXT NOT NULL DEFAULT '';
ALTER TABLE machines ADD COLUMN bind_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE machines ADD COLUMN bind_applied INTEGER NOT NULL DEFAULT 0;
UPDATE machines SET bound_ramdisk = ramdisk_node, bound_node = node;
CREATE INDEX machines_bound_node ON machines(bound_node) WHERE bound_node != '';
CREATE INDEX machines_bound_ramdisk ON machines(bound_ramdisk) WHERE bound_ramdisk != '';
CREATE INDEX machines_pending_bind ON machines(id) WHERE bind_seq != bind_applied;
ALTER TABLE deployments ADD COLUMN left_ramdisk TEXT NOT NULL DEFAULT '';
UPDATE deployments SET left_ramdisk = ramdisk_node, ramdisk_node = '' WHERE step IN ('bootdev', 'power', 'wait-join');
`

// schemaV6 adds what certificate renewal needs: the current certificate's key
// (a renewal retried after a lost answer must be for the same key) and the
// certificate the last renewal replaced.
const schemaV6 = `
ALTER TABLE nodes ADD COLUMN cert_key_sha256 TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN prev_cert_serial TEXT NOT NULL DEFAULT '';
`

// schemaV7 adds upgrades: the releases the operator added, a node's arch
// and daemon target (its spec's daemon section), its latest report on
// each section, and rollouts with their nodes and timelines.
// schemaV8 gives a pool policy its disruption budget (rollouts).
// schemaProvenEK keeps the TPM endorsement key a node's join proved by
// credential activation: a tpm join's, and a ramdisk's of a machine with an
// enrolled EK (deploy.image goes only to a ramdisk that proved it).
const schemaProvenEK = `
ALTER TABLE nodes ADD COLUMN proven_ek_sha256 TEXT NOT NULL DEFAULT '';
`

const schemaV8 = `
ALTER TABLE pool_policies ADD COLUMN max_unavailable INTEGER NOT NULL DEFAULT 0;
`

const schemaV7 = `
ALTER TABLE nodes ADD COLUMN daemon_arch TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN daemon_target TEXT;
ALTER TABLE nodes ADD COLUMN daemon_target_version TEXT NOT NULL DEFAULT '';
ALTER TABLE node_sessions ADD COLUMN daemon_arch TEXT NOT NULL DEFAULT '';
CREATE TABLE releases (
	version  TEXT PRIMARY KEY,
	product  TEXT NOT NULL,
	sequence INTEGER NOT NULL,
	expires  INTEGER NOT NULL,
	manifest TEXT NOT NULL,
	url_base TEXT NOT NULL,
	binaries TEXT NOT NULL,
	added_at INTEGER NOT NULL
);
CREATE TABLE node_section_status (
	node_id     TEXT NOT NULL,
	section     TEXT NOT NULL,
	state       TEXT NOT NULL,
	reason      TEXT NOT NULL DEFAULT '',
	message     TEXT NOT NULL DEFAULT '',
	version     TEXT NOT NULL DEFAULT '',
	revision    INTEGER NOT NULL,
	at          INTEGER NOT NULL,
	received_at INTEGER NOT NULL,
	PRIMARY KEY (node_id, section)
);
CREATE TABLE rollouts (
	id                TEXT PRIMARY KEY,
	version           TEXT NOT NULL,
	role              TEXT NOT NULL,
	pool              TEXT NOT NULL DEFAULT '',
	site              TEXT NOT NULL DEFAULT '',
	waves             TEXT NOT NULL,
	max_unavailable   INTEGER NOT NULL,
	failure_threshold INTEGER NOT NULL,
	wave_timeout_ms   INTEGER NOT NULL,
	state             TEXT NOT NULL,
	reason            TEXT NOT NULL DEFAULT '',
	revision          INTEGER NOT NULL DEFAULT 1,
	created_at        INTEGER NOT NULL,
	updated_at        INTEGER NOT NULL
);
CREATE INDEX rollouts_active ON rollouts(created_at) WHERE state IN ('running', 'paused');
CREATE TABLE rollout_nodes (
	rollout_id  TEXT NOT NULL REFERENCES rollouts(id),
	node_id     TEXT NOT NULL,
	pool        TEXT NOT NULL,
	wave        INTEGER NOT NULL,
	state       TEXT NOT NULL,
	reason      TEXT NOT NULL DEFAULT '',
	message     TEXT NOT NULL DEFAULT '',
	command_id  TEXT NOT NULL DEFAULT '',
	started_at  INTEGER,
	finished_at INTEGER,
	PRIMARY KEY (rollout_id, node_id)
);
CREATE TABLE rollout_events (
	id         INTEGER PRIMARY KEY,
	rollout_id TEXT NOT NULL REFERENCES rollouts(id),
	at         INTEGER NOT NULL,
	message    TEXT NOT NULL
);
CREATE INDEX rollout_events_rollout ON rollout_events(rollout_id, id);
`

// schemaV3 adds the machine lifecycle: a machine's firmware and current
// deployment, the deployments the lifecycle controller runs, and look-ups of
// a machine by its nodes.
const schemaV3 = `
ALTER TABLE machines ADD COLUMN firmware TEXT NOT NULL DEFAULT 'bios';
ALTER TABLE machines ADD COLUMN deployment TEXT NOT NULL DEFAULT '';
CREATE INDEX machines_node ON machines(node) WHERE node != '';
CREATE INDEX machines_ramdisk_node ON machines(ramdisk_node) WHERE ramdisk_node != '';
CREATE INDEX machines_state ON machines(state);
CREATE TABLE deployments (
	id              TEXT PRIMARY KEY,
	machine_id      TEXT NOT NULL,
	spec            TEXT NOT NULL,
	step            TEXT NOT NULL DEFAULT '',
	deadline        INTEGER,
	boot_attempts   INTEGER NOT NULL DEFAULT 0,
	deploy_attempts INTEGER NOT NULL DEFAULT 0,
	deploy_failures INTEGER NOT NULL DEFAULT 0,
	bmc_attempts    INTEGER NOT NULL DEFAULT 0,
	command_id      TEXT NOT NULL DEFAULT '',
	ramdisk_node    TEXT NOT NULL DEFAULT '',
	node_id         TEXT NOT NULL DEFAULT '',
	token_id        TEXT NOT NULL DEFAULT '',
	lost_at         INTEGER,
	node_session    INTEGER NOT NULL DEFAULT 0,
	node_boot_id    TEXT NOT NULL DEFAULT '',
	outcome         TEXT NOT NULL DEFAULT '',
	version         INTEGER NOT NULL DEFAULT 1,
	created_at      INTEGER NOT NULL,
	updated_at      INTEGER NOT NULL,
	finished_at     INTEGER
);
CREATE INDEX deployments_machine ON deployments(machine_id, created_at);
CREATE INDEX deployments_open ON deployments(created_at) WHERE finished_at IS NULL;
`

// schemaV5 adds TPM enrollments (an endorsement key's SHA-256 that may join
// a site and pool, a machine's own or an allow-list entry; one per machine)
// and the pools' policies (the attestors a join into the pool may use).
const schemaV5 = `
CREATE TABLE tpm_enrollments (
	ek_sha256  TEXT PRIMARY KEY,
	site       TEXT NOT NULL REFERENCES sites(name),
	pool       TEXT NOT NULL DEFAULT '',
	machine_id TEXT NOT NULL DEFAULT '',
	created_at INTEGER NOT NULL
);
CREATE UNIQUE INDEX tpm_enrollments_machine ON tpm_enrollments(machine_id) WHERE machine_id != '';
CREATE TABLE pool_policies (
	pool           TEXT PRIMARY KEY,
	join_attestors TEXT NOT NULL,
	updated_at     INTEGER NOT NULL
);
`

// schemaEKProven records whether the tpm attestor proved a node's EK
// (store.Node.TPMEKProven). A node from before it counts as proven when its
// EK is enrolled (only an enrolled EK joins with the tpm attestor), so a
// key proof does not reclaim a node its TPM may have joined.
const schemaEKProven = `
ALTER TABLE nodes ADD COLUMN tpm_ek_proven INTEGER NOT NULL DEFAULT 0;
UPDATE nodes SET tpm_ek_proven = 1
	WHERE tpm_ek_sha256 != '' AND tpm_ek_sha256 IN (SELECT ek_sha256 FROM tpm_enrollments);
`

// sqliteStore is the SQLite Store.
// queryAll reads every row query returns through scan, on db; op names the
// read in errors.
func queryAll[T any](ctx context.Context, db *sql.DB, op string, scan func(interface{ Scan(...any) error }) (T, error),
	query string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap(op, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, wrap(op, err)
		}
		out = append(out, v)
	}
	return out, wrap(op, rows.Err())
}

type sqliteStore struct {
	// w is the one connection that writes; r reads concurrently under WAL.
	// Every write goes through gate (tx and exec).
	w, r *sql.DB
	gate writeGate
	// stmts are the write connection's prepared statements of the hot paths.
	stmts stmtCache
}

// stmtCache keeps the hot paths' statements (hotStatements) prepared on the write
// connection. modernc's SQLite otherwise parses and plans a statement every time it
// runs: a third of what serve spent storing a storm's event (BenchmarkBootEvent).
// They are prepared by OpenFile, before any transaction holds the one connection.
type stmtCache struct {
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

// hotStatements are what a boot storm runs for every event, and a flood of
// script GETs for every boot nonce (AddBootNonces).
var hotStatements = []string{selectMachineByMAC, updateLastBoot, insertMachineEvent, insertEvent,
	deleteExpiredNonces, insertBootNonce}

func (s *sqliteStore) prepareHot(ctx context.Context) error {
	s.stmts.mu.Lock()
	defer s.stmts.mu.Unlock()
	s.stmts.m = map[string]*sql.Stmt{}
	for _, q := range hotStatements {
		st, err := s.w.PrepareContext(ctx, q)
		if err != nil {
			return fmt.Errorf("prepare %q: %w", strings.Fields(q)[0], err)
		}
		s.stmts.m[q] = st
	}
	return nil
}

// wstmt returns query as a statement of tx: the prepared one when it is a hot
// statement, else prepared now for tx alone. With tx nil it must be a hot one.
func (s *sqliteStore) wstmt(ctx context.Context, tx *sql.Tx, query string) (*sql.Stmt, error) {
	s.stmts.mu.Lock()
	st := s.stmts.m[query]
	s.stmts.mu.Unlock()
	switch {
	case st != nil && tx != nil:
		return tx.StmtContext(ctx, st), nil
	case st != nil:
		return st, nil
	case tx != nil:
		return tx.PrepareContext(ctx, query)
	}
	return nil, fmt.Errorf("statement %q is not prepared", strings.Fields(query)[0])
}

// execw runs a write in tx, or on the write connection, through the gate, when tx
// is nil.
func (s *sqliteStore) execw(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	st, err := s.wstmt(ctx, tx, query)
	if err != nil {
		return nil, err
	}
	if tx == nil {
		if err := s.gate.acquire(ctx); err != nil {
			return nil, err
		}
		defer s.gate.release()
	}
	return st.ExecContext(ctx, args...)
}

func (c *stmtCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, st := range c.m {
		errs = append(errs, st.Close())
	}
	c.m = nil
	return errors.Join(errs...)
}

// Open opens (creating when missing) the database DBFile in dir, which
// is created 0700 when it does not exist, and brings its schema up to date.
func Open(dir string) (store.Store, error) {
	// An existing directory others may write in is refused, not repaired: they
	// could have swapped the database or its WAL (token hashes, every node's
	// claims) already.
	if err := secretfile.CheckDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("store: data directory %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: data directory: %w", err)
	}
	return OpenFile(filepath.Join(dir, DBFile))
}

// OpenFile opens the database at path.
func OpenFile(path string) (store.Store, error) {
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("store: database path %q: ? and # are not allowed", path)
	}
	// Create the file 0600 ourselves: SQLite would use 0644 less the umask,
	// and the database holds token hashes and every node's claims.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	f.Close()
	const common = "_busy_timeout=10000&_foreign_keys=1&_synchronous=NORMAL&_txlock=immediate"
	w, err := sql.Open("sqlite", path+"?_journal_mode=WAL&"+common)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s := &sqliteStore{w: w}
	if err := s.migrate(context.Background()); err != nil {
		w.Close()
		return nil, fmt.Errorf("store: %s: %w", path, err)
	}
	if err := s.prepareHot(context.Background()); err != nil {
		s.stmts.close()
		w.Close()
		return nil, fmt.Errorf("store: %s: %w", path, err)
	}
	r, err := sql.Open("sqlite", path+"?_query_only=1&"+common)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	r.SetMaxOpenConns(8)
	r.SetMaxIdleConns(8)
	s.r = r
	return s, nil
}

func (s *sqliteStore) migrate(ctx context.Context) error {
	var v int
	if err := s.w.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	switch {
	case v == schemaVersion:
		return nil
	case v > schemaVersion:
		return fmt.Errorf("schema version %d is newer than this build's %d; run a newer better-compute", v, schemaVersion)
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for i := v; i < schemaVersion; i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migrate the schema to version %d: %w", i+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", schemaVersion)); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *sqliteStore) Close() error {
	return errors.Join(s.stmts.close(), s.r.Close(), s.w.Close())
}

// tx runs fn in a write transaction.
func (s *sqliteStore) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	if err := s.gate.acquire(ctx); err != nil {
		return err
	}
	defer s.gate.release()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// exec runs one write statement.
func (s *sqliteStore) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if err := s.gate.acquire(ctx); err != nil {
		return nil, err
	}
	defer s.gate.release()
	return s.w.ExecContext(ctx, query, args...)
}

// ms is a time as stored; the zero time is NULL.
func ms(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMilli()
}

// fromMS reads a stored time.
func fromMS(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMilli(v.Int64).UTC()
}

// nullJSON stores empty JSON as NULL.
func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

func rowsAffected(res sql.Result) (int64, error) {
	n, err := res.RowsAffected()
	if err != nil {
		return 0, err
	}
	return n, nil
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: %s: %w", op, store.ErrNotFound)
	}
	return fmt.Errorf("store: %s: %w", op, err)
}
