package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
)

const tokenColumns = `id, hash, pool, site, role, node_id, allow_reclaim, created_at, expires_at, used_at, used_by, revoked_at, machine_id`

func scanToken(sc interface{ Scan(...any) error }) (store.Token, error) {
	var t store.Token
	var hash []byte
	var created, expires, used, revoked sql.NullInt64
	if err := sc.Scan(&t.ID, &hash, &t.Pool, &t.Site, &t.Role, &t.NodeID, &t.AllowReclaim,
		&created, &expires, &used, &t.UsedBy, &revoked, &t.MachineID); err != nil {
		return store.Token{}, err
	}
	if len(hash) != len(t.Hash) {
		return store.Token{}, fmt.Errorf("token %s: hash is %d bytes, want %d", t.ID, len(hash), len(t.Hash))
	}
	copy(t.Hash[:], hash)
	t.CreatedAt, t.ExpiresAt, t.UsedAt, t.RevokedAt = fromMS(created), fromMS(expires), fromMS(used), fromMS(revoked)
	return t, nil
}

// execer is a *sql.DB or a *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func insertToken(ctx context.Context, db execer, t store.Token) error {
	_, err := db.ExecContext(ctx, `INSERT INTO join_tokens (`+tokenColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		t.ID, t.Hash[:], t.Pool, t.Site, t.Role, t.NodeID, t.AllowReclaim,
		ms(t.CreatedAt), ms(t.ExpiresAt), ms(t.UsedAt), t.UsedBy, ms(t.RevokedAt), t.MachineID)
	return err
}

func (s *sqliteStore) CreateToken(ctx context.Context, t store.Token) error {
	err := insertToken(ctx, s.w, t)
	switch {
	case isForeignKey(err):
		return fmt.Errorf("store: site %q: %w", t.Site, store.ErrNotFound)
	case isConstraint(err):
		return fmt.Errorf("store: token %s: %w", t.ID, store.ErrExists)
	}
	return wrap("create token", err)
}

func (s *sqliteStore) GetToken(ctx context.Context, id string) (store.Token, error) {
	t, err := scanToken(s.r.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM join_tokens WHERE id = ?`, id))
	return t, wrap("token "+id, err)
}

func (s *sqliteStore) ListTokens(ctx context.Context) ([]store.Token, error) {
	return queryAll(ctx, s.r, "list tokens", scanToken, `SELECT `+tokenColumns+` FROM join_tokens ORDER BY id`)
}

func (s *sqliteStore) RevokeToken(ctx context.Context, id string, at time.Time) error {
	return wrap("revoke token "+id, s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE join_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL`, ms(at), id)
		if err != nil {
			return err
		}
		if n, err := rowsAffected(res); err != nil || n == 1 {
			return err
		}
		var one int
		return tx.QueryRowContext(ctx, `SELECT 1 FROM join_tokens WHERE id = ?`, id).Scan(&one)
	}))
}

// consumeToken marks a token used by nodeID, within tx. When it cannot, it
// says why: used, revoked, expired or unknown.
func consumeToken(ctx context.Context, tx *sql.Tx, id, nodeID string, now time.Time) error {
	res, err := tx.ExecContext(ctx, `UPDATE join_tokens SET used_at = ?, used_by = ?
		WHERE id = ? AND used_at IS NULL AND revoked_at IS NULL AND expires_at > ?`,
		ms(now), nodeID, id, now.UnixMilli())
	if err != nil {
		return err
	}
	if n, err := rowsAffected(res); err != nil || n == 1 {
		return err
	}
	t, err := scanToken(tx.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM join_tokens WHERE id = ?`, id))
	if err != nil {
		return err
	}
	switch {
	case !t.RevokedAt.IsZero():
		return store.ErrTokenRevoked
	case !t.UsedAt.IsZero():
		return store.ErrTokenUsed
	default:
		return store.ErrTokenExpired
	}
}
