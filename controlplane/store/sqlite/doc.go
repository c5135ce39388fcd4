// Package sqlite is the store that `better-compute serve` runs on: pure Go
// SQLite (modernc.org/sqlite, no cgo) in one file, DBFile, of the data
// directory. Open returns it as a store.Store; the rest of the control plane
// never sees SQL.
//
// # Schema
//
//	sites           name PK, created_at, auto_approve (1: a ramdisk joins on
//	                its nonce alone), http_proxy (JSON, NULL for none),
//	                spec_revision (moved on with every change to what the
//	                site's agents are sent), updated_at
//	join_tokens     id PK, hash (SHA-256 of the secret), pool, site → sites,
//	                role, node_id ('' unless bound to a node: provisioned),
//	                allow_reclaim, created_at, expires_at, used_at, used_by,
//	                revoked_at, machine_id (the deploy that minted it)
//	nodes           id PK, role, site, pool, spiffe_id, claims (JSON),
//	                system_uuid, tpm_ek_sha256 (reclaim look-ups),
//	                cert_serial, cert_not_after, state, cordoned, created_at,
//	                updated_at, joined_at, deleted_at, session_id (the open
//	                session, NULL when offline), daemon_version, last_seen_at,
//	                spec_revision, cert_key_sha256 (the current certificate's
//	                key), prev_cert_serial (the one the last renewal replaced),
//	                daemon_arch, daemon_target, tpm_ek_proven (1: the tpm
//	                attestor proved tpm_ek_sha256),
//	                proven_ek_sha256 (the TPM EK its join proved, '' for none)
//	node_sessions   id PK, node_id, role, daemon_version, boot_id,
//	                protocol_version, remote_addr, connected_at,
//	                disconnected_at
//	commands        id PK, node_id, kind, params, state, reason, message,
//	                progress, result, created_at, updated_at, sent_at,
//	                machine_id ('' unless about a machine)
//	events          id PK, node_id, session_id, seq, kind, time, level,
//	                message, data, received_at
//	operator_tokens id PK, hash UNIQUE, created_at
//	machines        id PK (m_…), site → sites, created_at, updated_at;
//	                spec (the operator's, through machines.Service): name
//	                (NULL for none; UNIQUE per site), bmc_address, bmc_port,
//	                bmc_username, bmc_password (the file is 0600; never
//	                returned by the api), bmc_cipher_suite, firmware (bios,
//	                uefi), approved, boot_override ('', ramdisk, local,
//	                none); status (the lifecycle's only): state,
//	                state_reason, state_changed_at, boot_mode ('', ramdisk,
//	                local), ramdisk_node, node, deployment (the latest, ''
//	                for none), bind_applied; observed (agents' reports):
//	                inventory (JSON), inventory_at, last_boot_stage,
//	                last_boot_at, bound_ramdisk, bound_node, bind_seq (the
//	                JoinService's bindings, which the lifecycle adopts into
//	                ramdisk_node and node while bind_applied catches up)
//	machine_macs    mac PK (lowercase, colons), machine_id → machines
//	machine_events  id PK, machine_id, time, kind, message, node_id,
//	                command_id, data (JSON): the machine's timeline
//	deployments     id PK (dep_…), machine_id, spec (JSON DeploySpec: image,
//	                target, after, cmdline, pool; no secret), step,
//	                deadline, boot_attempts, deploy_attempts,
//	                deploy_failures, bmc_attempts,
//	                command_id, ramdisk_node (in use), left_ramdisk (left
//	                behind when it PXE-booted), node_id, token_id, lost_at,
//	                node_session, node_boot_id, outcome, version (grows
//	                with each write: a stale write is ErrConflict),
//	                created_at, updated_at, finished_at (NULL while it runs)
//	boot_nonces     hash PK (SHA-256 of the nonce), mac, site, site_node,
//	                machine_id, created_at, expires_at, csr_sha256 and
//	                deferred_at (the join waiting for approval), used_at,
//	                used_by
//	tpm_enrollments ek_sha256 PK (hex SHA-256 of the EK's PKIX DER), site,
//	                pool ('' for the default), machine_id ('' for an
//	                allow-list entry; unique otherwise), created_at
//	pool_policies   pool PK, join_attestors (comma-separated), max_unavailable, updated_at
//	images          name PK, url (sealed when it carries a credential), sha256,
//	                size, format, image_size, created_at: the image catalog
//
// Migrations are numbered by PRAGMA user_version (1: the first schema, 2:
// machines, 3: the machine lifecycle, 4: a machine's record split by owner,
// 5: TPM enrollments and pool policies, …,
// then retention's indexes, tpm_ek_proven and the image catalog)
// and run in one transaction at open; a
// database newer than the build is refused.
//
// Times are Unix milliseconds (UTC); an absent time is NULL.
//
// # Concurrency
//
// SQLite allows one writer at a time, so every write goes through a single
// connection (no busy-waiting between writers of the same process) while
// reads use a pool of their own under WAL. A join token is consumed by one
// UPDATE … WHERE used_at IS NULL inside the transaction that writes the node:
// of any number of concurrent joins with one token exactly one commits. A
// boot nonce is consumed the same way, in the transaction that writes the
// ramdisk's node and binds it to its machine. A command about a machine and
// each of its statuses go on the machine's timeline in the transaction that
// writes them (a RUNNING report at most every 5 s, but always the first one
// with progress). A lifecycle step writes its deployment, the machine's
// state with its "state" event, and the commands, tokens and events it
// makes in one transaction (StartDeployment, AdvanceDeployment). The
// installed OS's join retires the machine's ramdisk node and the node an
// earlier deployment installed. A site agent's reports of a storm are written
// a batch at a time, with statements prepared once on the write connection
// (hotStatements): its boot steps (RecordBoots), its boot nonces with their
// timeline entries (AddBootNonces, one commit and one expired-nonce DELETE a
// batch, the machine found by MAC inside the transaction) and its events
// (AddEvents).
//
// # Retention
//
// Prune (store.Retention, run by controlplane/retention) bounds events,
// machine_events and boot_nonces, which agents' reports and every script GET of
// a site's boot server fill: it finds what goes on the read connection and
// deletes it in transactions of at most a batch of rows, so the write lock is
// never held for long. A machine's timeline keeps the first entry of each kind
// and the latest PerKind; a MAC keeps its newest nonces, and those a waiting
// join holds. The migration after the last numbered one adds its indexes.
package sqlite
