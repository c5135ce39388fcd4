package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/token"
)

func (s *sqliteStore) CreateSite(ctx context.Context, site Site) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO sites (name, created_at) VALUES (?, ?)`, site.Name, ms(site.CreatedAt))
	if isConstraint(err) {
		return fmt.Errorf("store: site %q: %w", site.Name, ErrExists)
	}
	return wrap("create site", err)
}

func (s *sqliteStore) GetSite(ctx context.Context, name string) (Site, error) {
	var site Site
	var created sql.NullInt64
	err := s.r.QueryRowContext(ctx, `SELECT name, created_at FROM sites WHERE name = ?`, name).Scan(&site.Name, &created)
	if err != nil {
		return Site{}, wrap(fmt.Sprintf("site %q", name), err)
	}
	site.CreatedAt = fromMS(created)
	return site, nil
}

func (s *sqliteStore) ListSites(ctx context.Context) ([]Site, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT name, created_at FROM sites ORDER BY name`)
	if err != nil {
		return nil, wrap("list sites", err)
	}
	defer rows.Close()
	var out []Site
	for rows.Next() {
		var site Site
		var created sql.NullInt64
		if err := rows.Scan(&site.Name, &created); err != nil {
			return nil, wrap("list sites", err)
		}
		site.CreatedAt = fromMS(created)
		out = append(out, site)
	}
	return out, wrap("list sites", rows.Err())
}

// isConstraint reports a UNIQUE, PRIMARY KEY or FOREIGN KEY violation. The
// driver's error text is stable across its versions; matching it keeps the
// driver's types out of this package's API.
func isConstraint(err error) bool {
	return err != nil && strings.Contains(err.Error(), "constraint failed")
}

func isForeignKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "FOREIGN KEY constraint failed")
}

func (s *sqliteStore) EnsureOperatorToken(ctx context.Context, h token.Hash, at time.Time) (bool, error) {
	created := false
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM operator_tokens`).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO operator_tokens (hash, created_at) VALUES (?, ?)`, h[:], ms(at)); err != nil {
			return err
		}
		created = true
		return nil
	})
	return created, wrap("operator token", err)
}

func (s *sqliteStore) OperatorTokenHashes(ctx context.Context) ([]token.Hash, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT hash FROM operator_tokens`)
	if err != nil {
		return nil, wrap("operator tokens", err)
	}
	defer rows.Close()
	var out []token.Hash
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, wrap("operator tokens", err)
		}
		var h token.Hash
		if len(b) != len(h) {
			return nil, fmt.Errorf("store: operator token hash is %d bytes, want %d", len(b), len(h))
		}
		copy(h[:], b)
		out = append(out, h)
	}
	return out, wrap("operator tokens", rows.Err())
}
