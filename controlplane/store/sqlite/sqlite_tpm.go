package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

const enrollmentColumns = `ek_sha256, site, pool, machine_id, created_at`

func scanEnrollment(sc interface{ Scan(...any) error }) (store.TPMEnrollment, error) {
	var e store.TPMEnrollment
	var created sql.NullInt64
	if err := sc.Scan(&e.EKSHA256, &e.Site, &e.Pool, &e.MachineID, &created); err != nil {
		return store.TPMEnrollment{}, err
	}
	e.CreatedAt = fromMS(created)
	return e, nil
}

// holder is the enrollment of ek within tx, ok false for none.
func holder(ctx context.Context, tx *sql.Tx, ek string) (store.TPMEnrollment, bool, error) {
	e, err := scanEnrollment(tx.QueryRowContext(ctx, `SELECT `+enrollmentColumns+` FROM tpm_enrollments WHERE ek_sha256 = ?`, ek))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return e, false, nil
	case err != nil:
		return e, false, err
	}
	return e, true, nil
}

func (s *sqliteStore) EnrollTPM(ctx context.Context, e store.TPMEnrollment) error {
	if e.MachineID != "" {
		return fmt.Errorf("store: enroll TPM %s: a machine's enrollment is written with UpdateMachine", e.EKSHA256)
	}
	return wrap("enroll TPM "+e.EKSHA256, s.tx(ctx, func(tx *sql.Tx) error {
		old, ok, err := holder(ctx, tx, e.EKSHA256)
		switch {
		case err != nil:
			return err
		case ok && old.MachineID != "":
			return &store.EKConflictError{EKSHA256: e.EKSHA256, Machine: old.MachineID}
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO tpm_enrollments (ek_sha256, site, pool, machine_id, created_at) VALUES (?, ?, ?, '', ?)
			ON CONFLICT (ek_sha256) DO UPDATE SET site = excluded.site, pool = excluded.pool, created_at = excluded.created_at`,
			e.EKSHA256, e.Site, e.Pool, ms(e.CreatedAt))
		if isForeignKey(err) {
			return fmt.Errorf("site %q: %w", e.Site, store.ErrNotFound)
		}
		return err
	}))
}

// setMachineTPM makes e (nil: none) the TPM enrollment of machine m, within
// tx, and puts the change on its timeline. The EK of an allow-list entry
// becomes the machine's; one another machine holds is *EKConflictError.
func setMachineTPM(ctx context.Context, tx *sql.Tx, m store.Machine, e *store.TPMEnrollment, at time.Time) error {
	if e == nil {
		if m.TPMEKSHA256 == "" {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM tpm_enrollments WHERE machine_id = ?`, m.ID); err != nil {
			return err
		}
		return addMachineEvent(ctx, tx, store.MachineEvent{MachineID: m.ID, Time: at, Kind: protocol.MachineEventTPM,
			Message: "TPM endorsement key " + m.TPMEKSHA256 + " no longer enrolled"})
	}
	old, ok, err := holder(ctx, tx, e.EKSHA256)
	switch {
	case err != nil:
		return err
	case ok && old.MachineID != "" && old.MachineID != m.ID:
		return &store.EKConflictError{EKSHA256: e.EKSHA256, Machine: old.MachineID}
	case ok && old.MachineID == m.ID && old.Pool == e.Pool:
		return nil
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM tpm_enrollments WHERE machine_id = ? OR ek_sha256 = ?`, m.ID, e.EKSHA256); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO tpm_enrollments (ek_sha256, site, pool, machine_id, created_at) VALUES (?, ?, ?, ?, ?)`,
		e.EKSHA256, m.Site, e.Pool, m.ID, ms(at)); err != nil {
		return err
	}
	pool := e.Pool
	if pool == "" {
		pool = "the default pool"
	} else {
		pool = "pool " + pool
	}
	return addMachineEvent(ctx, tx, store.MachineEvent{MachineID: m.ID, Time: at, Kind: protocol.MachineEventTPM,
		Message: "TPM endorsement key " + e.EKSHA256 + " enrolled: its tpm join enters " + pool})
}

func (s *sqliteStore) GetTPMEnrollment(ctx context.Context, ek string) (store.TPMEnrollment, error) {
	e, err := scanEnrollment(s.r.QueryRowContext(ctx, `SELECT `+enrollmentColumns+` FROM tpm_enrollments WHERE ek_sha256 = ?`, ek))
	return e, wrap("TPM enrollment "+ek, err)
}

func (s *sqliteStore) ListTPMEnrollments(ctx context.Context) ([]store.TPMEnrollment, error) {
	return queryAll(ctx, s.r, "list TPM enrollments", scanEnrollment, `SELECT `+enrollmentColumns+` FROM tpm_enrollments ORDER BY created_at, ek_sha256`)
}

func (s *sqliteStore) RevokeTPMEnrollment(ctx context.Context, ek string, at time.Time) error {
	return wrap("revoke TPM enrollment "+ek, s.tx(ctx, func(tx *sql.Tx) error {
		old, ok, err := holder(ctx, tx, ek)
		switch {
		case err != nil:
			return err
		case !ok:
			return sql.ErrNoRows
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM tpm_enrollments WHERE ek_sha256 = ?`, ek); err != nil {
			return err
		}
		if old.MachineID == "" {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE machines SET updated_at = ? WHERE id = ?`, ms(at), old.MachineID); err != nil {
			return err
		}
		return addMachineEvent(ctx, tx, store.MachineEvent{MachineID: old.MachineID, Time: at, Kind: protocol.MachineEventTPM,
			Message: "TPM endorsement key " + ek + " revoked"})
	}))
}

func (s *sqliteStore) SetPoolPolicy(ctx context.Context, p store.PoolPolicy) error {
	return wrap("set policy of pool "+p.Pool, s.tx(ctx, func(tx *sql.Tx) error {
		if len(p.JoinAttestors) == 0 && p.MaxUnavailable == 0 {
			_, err := tx.ExecContext(ctx, `DELETE FROM pool_policies WHERE pool = ?`, p.Pool)
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO pool_policies (pool, join_attestors, max_unavailable, updated_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (pool) DO UPDATE SET join_attestors = excluded.join_attestors, max_unavailable = excluded.max_unavailable,
			updated_at = excluded.updated_at`,
			p.Pool, strings.Join(p.JoinAttestors, ","), p.MaxUnavailable, ms(p.UpdatedAt))
		return err
	}))
}

func scanPolicy(sc interface{ Scan(...any) error }) (store.PoolPolicy, error) {
	var p store.PoolPolicy
	var attestors string
	var updated sql.NullInt64
	if err := sc.Scan(&p.Pool, &attestors, &p.MaxUnavailable, &updated); err != nil {
		return store.PoolPolicy{}, err
	}
	if attestors != "" {
		p.JoinAttestors = strings.Split(attestors, ",")
	}
	p.UpdatedAt = fromMS(updated)
	return p, nil
}

func (s *sqliteStore) GetPoolPolicy(ctx context.Context, pool string) (store.PoolPolicy, error) {
	p, err := scanPolicy(s.r.QueryRowContext(ctx, `SELECT pool, join_attestors, max_unavailable, updated_at FROM pool_policies WHERE pool = ?`, pool))
	return p, wrap("policy of pool "+pool, err)
}

func (s *sqliteStore) ListPoolPolicies(ctx context.Context) ([]store.PoolPolicy, error) {
	return queryAll(ctx, s.r, "list pool policies", scanPolicy, `SELECT pool, join_attestors, max_unavailable, updated_at FROM pool_policies ORDER BY pool`)
}
