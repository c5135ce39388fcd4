package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/protocol"
)

const siteColumns = `name, auto_approve, http_proxy, spec_revision, created_at, updated_at`

func scanSite(sc interface{ Scan(...any) error }) (store.Site, error) {
	var site store.Site
	var auto bool
	var proxy sql.NullString
	var created, updated sql.NullInt64
	if err := sc.Scan(&site.Name, &auto, &proxy, &site.SpecRevision, &created, &updated); err != nil {
		return store.Site{}, err
	}
	site.Approval = store.ApprovalAuto
	if !auto {
		site.Approval = store.ApprovalManual
	}
	if proxy.Valid {
		site.HTTPProxy = new(protocol.HTTPProxySection)
		if err := json.Unmarshal([]byte(proxy.String), site.HTTPProxy); err != nil {
			return store.Site{}, fmt.Errorf("site %s: http_proxy: %w", site.Name, err)
		}
	}
	site.CreatedAt, site.UpdatedAt = fromMS(created), fromMS(updated)
	return site, nil
}

func (s *sqliteStore) CreateSite(ctx context.Context, site store.Site) error {
	proxy, err := proxyJSON(site.HTTPProxy)
	if err != nil {
		return err
	}
	_, err = s.exec(ctx, `INSERT INTO sites (name, auto_approve, http_proxy, spec_revision, created_at, updated_at)
		VALUES (?, ?, ?, 1, ?, ?)`, site.Name, !site.ManualApproval(), proxy, ms(site.CreatedAt), ms(site.CreatedAt))
	if isConstraint(err) {
		return fmt.Errorf("store: site %q: %w", site.Name, store.ErrExists)
	}
	return wrap("create site", err)
}

func proxyJSON(p *protocol.HTTPProxySection) (any, error) {
	if p == nil {
		return nil, nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("store: http_proxy: %w", err)
	}
	return string(b), nil
}

func (s *sqliteStore) GetSite(ctx context.Context, name string) (store.Site, error) {
	site, err := scanSite(s.r.QueryRowContext(ctx, `SELECT `+siteColumns+` FROM sites WHERE name = ?`, name))
	return site, wrap(fmt.Sprintf("site %q", name), err)
}

func (s *sqliteStore) ListSites(ctx context.Context) ([]store.Site, error) {
	return queryAll(ctx, s.r, "list sites", scanSite, `SELECT `+siteColumns+` FROM sites ORDER BY name`)
}

func (s *sqliteStore) SetSiteHTTPProxy(ctx context.Context, name string, p *protocol.HTTPProxySection, at time.Time) (store.Site, error) {
	proxy, err := proxyJSON(p)
	if err != nil {
		return store.Site{}, err
	}
	var site store.Site
	err = s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE sites SET http_proxy = ?, spec_revision = spec_revision + 1, updated_at = ?
			WHERE name = ?`, proxy, ms(at), name)
		if err != nil {
			return err
		}
		if n, err := rowsAffected(res); err != nil || n != 1 {
			return errors.Join(err, store.ErrNotFound)
		}
		site, err = scanSite(tx.QueryRowContext(ctx, `SELECT `+siteColumns+` FROM sites WHERE name = ?`, name))
		return err
	})
	return site, wrap(fmt.Sprintf("site %q: http proxy", name), err)
}

// bumpSpec moves a site's spec revision on, within tx.
func bumpSpec(ctx context.Context, tx *sql.Tx, site string, at time.Time) error {
	_, err := tx.ExecContext(ctx, `UPDATE sites SET spec_revision = spec_revision + 1, updated_at = ? WHERE name = ?`, ms(at), site)
	return err
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
