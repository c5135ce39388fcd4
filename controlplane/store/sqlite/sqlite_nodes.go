package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

const nodeColumns = `id, role, site, pool, spiffe_id, claims, system_uuid, tpm_ek_sha256, cert_serial, cert_not_after,
	state, cordoned, created_at, updated_at, joined_at, deleted_at, session_id, daemon_version, last_seen_at, spec_revision,
	cert_key_sha256, prev_cert_serial, daemon_arch, daemon_target, tpm_ek_proven, proven_ek_sha256`

func scanNode(sc interface{ Scan(...any) error }) (store.Node, error) {
	var n store.Node
	var claims string
	var target sql.NullString
	var notAfter, created, updated, joined, deleted, lastSeen, session sql.NullInt64
	if err := sc.Scan(&n.ID, &n.Role, &n.Site, &n.Pool, &n.SPIFFEID, &claims, &n.SystemUUID, &n.TPMEKSHA256,
		&n.CertSerial, &notAfter, &n.State, &n.Cordoned, &created, &updated, &joined, &deleted, &session,
		&n.DaemonVersion, &lastSeen, &n.SpecRevision, &n.CertKeySHA256, &n.PrevCertSerial,
		&n.DaemonArch, &target, &n.TPMEKProven, &n.ProvenEKSHA256); err != nil {
		return store.Node{}, err
	}
	if target.Valid {
		var d protocol.DaemonSection
		if err := json.Unmarshal([]byte(target.String), &d); err != nil {
			return store.Node{}, fmt.Errorf("node %s: daemon target: %w", n.ID, err)
		}
		n.DaemonTarget = &d
	}
	n.Claims = []byte(claims)
	n.CertNotAfter, n.CreatedAt, n.UpdatedAt, n.JoinedAt = fromMS(notAfter), fromMS(created), fromMS(updated), fromMS(joined)
	n.DeletedAt, n.LastSeenAt = fromMS(deleted), fromMS(lastSeen)
	n.SessionID = session.Int64
	return n, nil
}

func (s *sqliteStore) Admit(ctx context.Context, a store.Admission) error {
	n := a.Node
	claims := string(n.Claims)
	if claims == "" {
		claims = "{}"
	}
	return wrap("admit node "+n.ID, s.tx(ctx, func(tx *sql.Tx) error {
		if a.TokenID != "" {
			if err := consumeToken(ctx, tx, a.TokenID, n.ID, a.Now); err != nil {
				return err
			}
		}
		if a.BootNonce != nil {
			if err := consumeNonce(ctx, tx, *a.BootNonce, n.ID, a.Now); err != nil {
				return err
			}
		}
		if a.Reclaim {
			if err := updateLiveNode(ctx, tx, n.ID, `role = ?, site = ?, pool = ?, spiffe_id = ?, claims = ?,
				system_uuid = ?, tpm_ek_sha256 = ?, cert_serial = ?, cert_not_after = ?, state = ?,
				updated_at = ?, joined_at = ?, cert_key_sha256 = ?, prev_cert_serial = '', tpm_ek_proven = ?, proven_ek_sha256 = ?`,
				n.Role, n.Site, n.Pool, n.SPIFFEID, claims, n.SystemUUID, n.TPMEKSHA256, n.CertSerial,
				ms(n.CertNotAfter), n.State, ms(a.Now), ms(a.Now), n.CertKeySHA256, n.TPMEKProven, n.ProvenEKSHA256); err != nil {
				return err
			}
		} else {
			_, err := tx.ExecContext(ctx, `INSERT INTO nodes (id, role, site, pool, spiffe_id, claims, system_uuid,
				tpm_ek_sha256, cert_serial, cert_not_after, state, cordoned, created_at, updated_at, joined_at,
				cert_key_sha256, tpm_ek_proven, proven_ek_sha256)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?)`,
				n.ID, n.Role, n.Site, n.Pool, n.SPIFFEID, claims, n.SystemUUID, n.TPMEKSHA256, n.CertSerial,
				ms(n.CertNotAfter), n.State, ms(a.Now), ms(a.Now), ms(a.Now), n.CertKeySHA256, n.TPMEKProven, n.ProvenEKSHA256)
			if isConstraint(err) {
				return store.ErrExists
			}
			if err != nil {
				return err
			}
		}
		if a.Retire != "" && a.Retire != n.ID {
			if err := deleteNode(ctx, tx, a.Retire, a.Now, "the machine's next agent joined"); err != nil &&
				!errors.Is(err, store.ErrNodeDeleted) && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		if a.TPMEnrollment != nil {
			e := *a.TPMEnrollment
			m, err := scanMachine(tx.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines WHERE id = ?`, e.MachineID))
			switch {
			case errors.Is(err, sql.ErrNoRows):
				return fmt.Errorf("machine %s: %w", e.MachineID, store.ErrNoMachine)
			case err != nil:
				return err
			}
			if err := setMachineTPM(ctx, tx, m, &e, a.Now); err != nil {
				return err
			}
		}
		if a.Machine != "" {
			return bindMachine(ctx, tx, a)
		}
		return nil
	}))
}

func (s *sqliteStore) RenewNodeCert(ctx context.Context, r store.CertRenewal) error {
	return wrap("renew the certificate of node "+r.NodeID, s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET cert_serial = ?, cert_not_after = ?, cert_key_sha256 = ?,
			prev_cert_serial = ?, updated_at = ? WHERE id = ? AND deleted_at IS NULL AND cert_serial = ?`,
			r.Serial, ms(r.NotAfter), r.KeySHA256, r.Presented, ms(r.At), r.NodeID, r.Replaces)
		if err != nil {
			return err
		}
		if n, err := rowsAffected(res); err != nil || n == 1 {
			return err
		}
		var deleted sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT deleted_at FROM nodes WHERE id = ?`, r.NodeID).Scan(&deleted); err != nil {
			return err
		}
		if deleted.Valid {
			return store.ErrNodeDeleted
		}
		return store.ErrCertReplaced
	}))
}

func (s *sqliteStore) GetNode(ctx context.Context, id string) (store.Node, error) {
	n, err := scanNode(s.r.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE id = ?`, id))
	return n, wrap("node "+id, err)
}

func (s *sqliteStore) FindNodeByClaims(ctx context.Context, systemUUID, tpmEKSHA256 string) (store.Node, error) {
	if tpmEKSHA256 != "" {
		n, err := scanNode(s.r.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes
			WHERE tpm_ek_sha256 = ? AND tpm_ek_sha256 != '' AND deleted_at IS NULL ORDER BY joined_at DESC LIMIT 1`, tpmEKSHA256))
		if !errors.Is(err, sql.ErrNoRows) {
			return n, wrap("find node by TPM EK", err)
		}
	}
	if systemUUID != "" {
		n, err := scanNode(s.r.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes
			WHERE system_uuid = ? AND system_uuid != '' AND deleted_at IS NULL ORDER BY joined_at DESC LIMIT 1`, systemUUID))
		return n, wrap("find node by system UUID", err)
	}
	return store.Node{}, fmt.Errorf("store: find node by claims: %w", store.ErrNotFound)
}

func (s *sqliteStore) ListNodes(ctx context.Context) ([]store.Node, error) {
	return queryAll(ctx, s.r, "list nodes", scanNode, `SELECT `+nodeColumns+` FROM nodes WHERE deleted_at IS NULL ORDER BY id`)
}

// updateLiveNode runs a one-row UPDATE of a node that is not deleted and
// tells a missing node (ErrNotFound) from a deleted one (ErrNodeDeleted).
func updateLiveNode(ctx context.Context, tx *sql.Tx, id, set string, args ...any) error {
	res, err := tx.ExecContext(ctx, `UPDATE nodes SET `+set+` WHERE id = ? AND deleted_at IS NULL`, append(args, id)...)
	if err != nil {
		return err
	}
	if n, err := rowsAffected(res); err != nil || n == 1 {
		return err
	}
	var deleted sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT deleted_at FROM nodes WHERE id = ?`, id).Scan(&deleted); err != nil {
		return err
	}
	return store.ErrNodeDeleted
}

func (s *sqliteStore) DeleteNode(ctx context.Context, id string, at time.Time) error {
	return wrap("delete node "+id, s.tx(ctx, func(tx *sql.Tx) error {
		return deleteNode(ctx, tx, id, at, "the node was deleted")
	}))
}

// deleteNode marks a node deleted and fails its open commands, within tx.
func deleteNode(ctx context.Context, tx *sql.Tx, id string, at time.Time, why string) error {
	if err := updateLiveNode(ctx, tx, id, `deleted_at = ?, updated_at = ?`, ms(at), ms(at)); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `UPDATE commands SET state = 'FAILED', reason = ?,
		message = ?, updated_at = ?
		WHERE node_id = ? AND state NOT IN ('SUCCEEDED', 'FAILED', 'UNSUPPORTED')`, protocol.ReasonNodeDeleted, why, ms(at), id)
	return err
}

func (s *sqliteStore) SetCordoned(ctx context.Context, id string, cordoned bool, at time.Time) error {
	return wrap("cordon node "+id, s.tx(ctx, func(tx *sql.Tx) error {
		return updateLiveNode(ctx, tx, id, `cordoned = ?, updated_at = ?`, cordoned, ms(at))
	}))
}

func (s *sqliteStore) SetNodeState(ctx context.Context, id, from, to string, at time.Time) (bool, error) {
	res, err := s.exec(ctx, `UPDATE nodes SET state = ?, updated_at = ? WHERE id = ? AND state = ? AND deleted_at IS NULL`,
		to, ms(at), id, from)
	if err != nil {
		return false, wrap("node state", err)
	}
	n, err := rowsAffected(res)
	return n == 1, wrap("node state", err)
}
