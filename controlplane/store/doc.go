// Package store keeps the control plane's state: sites, join tokens, nodes,
// gateway sessions, commands and their statuses, events, and the operator
// token's hash.
//
// The rest of the control plane depends on the small interfaces here (Sites,
// Tokens, Nodes, Sessions, Commands, Operators), never on SQL, so a
// deployment that outgrows one machine can put several api and gateway
// processes on another implementation (PostgreSQL) without touching them.
// OpenSQLite is the implementation that `better-compute serve` runs on: pure
// Go SQLite (modernc.org/sqlite, no cgo) in one file of the data directory.
//
// # Schema
//
//	sites           name PK, created_at
//	join_tokens     id PK, hash (SHA-256 of the secret), pool, site → sites,
//	                role, node_id ('' unless bound to a node: provisioned),
//	                allow_reclaim, created_at, expires_at, used_at, used_by,
//	                revoked_at
//	nodes           id PK, role, site, pool, spiffe_id, claims (JSON),
//	                system_uuid, tpm_ek_sha256 (reclaim look-ups),
//	                cert_serial, cert_not_after, state, cordoned, created_at,
//	                updated_at, joined_at, deleted_at, session_id (the open
//	                session, NULL when offline), daemon_version, last_seen_at,
//	                spec_revision
//	node_sessions   id PK, node_id, role, daemon_version, boot_id,
//	                protocol_version, remote_addr, connected_at,
//	                disconnected_at
//	commands        id PK, node_id, kind, params, state, reason, message,
//	                progress, result, created_at, updated_at, sent_at
//	events          id PK, node_id, session_id, seq, kind, time, level,
//	                message, data, received_at
//	operator_tokens id PK, hash UNIQUE, created_at
//
// Times are Unix milliseconds (UTC); an absent time is NULL.
//
// # Concurrency
//
// SQLite allows one writer at a time, so every write goes through a single
// connection (no busy-waiting between writers of the same process) while
// reads use a pool of their own under WAL. A join token is consumed by one
// UPDATE … WHERE used_at IS NULL inside the transaction that writes the node:
// of any number of concurrent joins with one token exactly one commits.
package store
