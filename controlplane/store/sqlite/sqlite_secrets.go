package sqlite

import (
	"context"
	"database/sql"

	"github.com/better-compute/bcd/controlplane/store"
)

// secretColumns are where each store.SecretField is kept.
var secretColumns = []struct {
	field         store.SecretField
	table, column string
}{
	{store.SecretBMCPassword, "machines", "bmc_password"},
	{store.SecretCommandParams, "commands", "params"},
	{store.SecretDeploySpec, "deployments", "spec"},
	{store.SecretImageURL, "images", "url"},
}

// RewriteSecrets implements store.SecretRewriter.
func (s *sqliteStore) RewriteSecrets(ctx context.Context, fn func(f store.SecretField, value string) (string, error)) (int, error) {
	n := 0
	err := s.tx(ctx, func(tx *sql.Tx) error {
		for _, c := range secretColumns {
			type row struct {
				id int64
				v  string
			}
			rows, err := tx.QueryContext(ctx, `SELECT rowid, `+c.column+` FROM `+c.table+` WHERE `+c.column+` IS NOT NULL AND `+c.column+` != ''`)
			if err != nil {
				return err
			}
			var all []row
			for rows.Next() {
				var r row
				if err := rows.Scan(&r.id, &r.v); err != nil {
					rows.Close()
					return err
				}
				all = append(all, r)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			for _, r := range all {
				nv, err := fn(c.field, r.v)
				if err != nil {
					return err
				}
				if nv == r.v {
					continue
				}
				if _, err := tx.ExecContext(ctx, `UPDATE `+c.table+` SET `+c.column+` = ? WHERE rowid = ?`, nv, r.id); err != nil {
					return err
				}
				n++
			}
		}
		return nil
	})
	if err != nil {
		return 0, wrap("rewrite secrets", err)
	}
	return n, nil
}
