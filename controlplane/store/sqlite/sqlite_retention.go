package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
)

// schemaRetention adds the indexes the pruner (store.Retention) deletes by: a
// node's and a machine's entries by kind, each table by age, boot nonces by MAC.
const schemaRetention = `
CREATE INDEX events_node_kind ON events(node_id, kind, id);
CREATE INDEX events_received ON events(received_at);
CREATE INDEX machine_events_machine_kind ON machine_events(machine_id, kind, id);
CREATE INDEX machine_events_time ON machine_events(time);
CREATE INDEX boot_nonces_mac ON boot_nonces(mac);
CREATE INDEX boot_nonces_created ON boot_nonces(created_at);
`

// timeline is one of the two event tables and the column its entries are
// owned by.
type timeline struct {
	table, owner, age string
}

var (
	nodeEvents    = timeline{"events", "node_id", "received_at"}
	machineEvents = timeline{"machine_events", "machine_id", "time"}
)

// Prune deletes what r does not keep, at most batch rows a transaction. The
// look-ups (which groups are over their count, where a cut falls) run on the
// read connection; only the deletes take the write lock, one batch each.
func (s *sqliteStore) Prune(ctx context.Context, r store.Retention, now time.Time, batch int) (store.Pruned, error) {
	if batch <= 0 {
		return store.Pruned{}, fmt.Errorf("store: prune: batch %d: want at least 1", batch)
	}
	var p store.Pruned
	var err error
	if p.Events, err = s.pruneTimeline(ctx, nodeEvents, r, now, batch); err != nil {
		return p, wrap("prune events", err)
	}
	if p.MachineEvents, err = s.pruneTimeline(ctx, machineEvents, r, now, batch); err != nil {
		return p, wrap("prune machine events", err)
	}
	if p.BootNonces, err = s.pruneNonces(ctx, r, now, batch); err != nil {
		return p, wrap("prune boot nonces", err)
	}
	return p, nil
}

// deleteIDs deletes up to batch rows of table that sel (a SELECT of their ids,
// without LIMIT) picks, in one write transaction.
func (s *sqliteStore) deleteIDs(ctx context.Context, table, key, sel string, batch int, args ...any) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE `+key+` IN (`+sel+` LIMIT ?)`, append(args, batch)...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

func (s *sqliteStore) pruneTimeline(ctx context.Context, t timeline, r store.Retention, now time.Time, batch int) (int, error) {
	deleted := 0
	if r.MaxAge > 0 {
		n, err := s.deleteIDs(ctx, t.table, "id", `SELECT id FROM `+t.table+` WHERE `+t.age+` < ? ORDER BY `+t.age,
			batch, now.Add(-r.MaxAge).UnixMilli())
		if err != nil {
			return deleted, err
		}
		deleted += n
	}
	if r.PerKind > 0 && deleted < batch {
		n, err := s.prunePerKind(ctx, t, r.PerKind, batch-deleted)
		if err != nil {
			return deleted, err
		}
		deleted += n
	}
	if r.MaxTotal > 0 && deleted < batch {
		var total int
		if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+t.table).Scan(&total); err != nil {
			return deleted, err
		}
		if over := total - r.MaxTotal; over > 0 {
			n, err := s.deleteIDs(ctx, t.table, "id", `SELECT id FROM `+t.table+` ORDER BY id`, min(over, batch-deleted))
			if err != nil {
				return deleted, err
			}
			deleted += n
		}
	}
	return deleted, nil
}

// prunePerKind deletes, of each owner's entries of one kind beyond the latest
// keep, all but the first: up to budget rows, one transaction per owner and kind.
func (s *sqliteStore) prunePerKind(ctx context.Context, t timeline, keep, budget int) (int, error) {
	type group struct {
		owner, kind string
		first, cut  int64
	}
	// The cut is the id of the keep-th newest entry: what is below it and
	// above the first goes. The scan is of events_node_kind (or its
	// machine_events twin) on the read connection.
	rows, err := s.r.QueryContext(ctx, `SELECT g.owner, g.kind, g.first, (SELECT id FROM `+t.table+` e
			WHERE e.`+t.owner+` = g.owner AND e.kind = g.kind ORDER BY id DESC LIMIT 1 OFFSET ?)
		FROM (SELECT `+t.owner+` AS owner, kind, MIN(id) AS first FROM `+t.table+`
			GROUP BY `+t.owner+`, kind HAVING COUNT(*) > ?) g`, keep-1, keep+1)
	if err != nil {
		return 0, err
	}
	var groups []group
	for rows.Next() {
		var g group
		if err := rows.Scan(&g.owner, &g.kind, &g.first, &g.cut); err != nil {
			rows.Close()
			return 0, err
		}
		groups = append(groups, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	deleted := 0
	for _, g := range groups {
		if deleted >= budget {
			break
		}
		n, err := s.deleteIDs(ctx, t.table, "id", `SELECT id FROM `+t.table+` WHERE `+t.owner+` = ? AND kind = ? AND id > ? AND id < ?
			ORDER BY id`, budget-deleted, g.owner, g.kind, g.first, g.cut)
		if err != nil {
			return deleted, err
		}
		deleted += n
	}
	return deleted, nil
}

// pruneNonces bounds boot_nonces by age, per MAC and in total. A MAC keeps its
// newest nonces (the live one is the newest: the script a ramdisk booted with
// is the last one served) and any a waiting join holds (csr_sha256 set, not
// used); the total bound takes the oldest of all.
func (s *sqliteStore) pruneNonces(ctx context.Context, r store.Retention, now time.Time, batch int) (int, error) {
	deleted := 0
	if r.MaxAge > 0 {
		n, err := s.deleteIDs(ctx, "boot_nonces", "rowid", `SELECT rowid FROM boot_nonces WHERE created_at < ? ORDER BY created_at`,
			batch, now.Add(-r.MaxAge).UnixMilli())
		if err != nil {
			return deleted, err
		}
		deleted += n
	}
	if r.NoncesPerMAC > 0 && deleted < batch {
		rows, err := s.r.QueryContext(ctx, `SELECT g.mac, (SELECT rowid FROM boot_nonces n WHERE n.mac = g.mac
				ORDER BY rowid DESC LIMIT 1 OFFSET ?)
			FROM (SELECT mac FROM boot_nonces GROUP BY mac HAVING COUNT(*) > ?) g`, r.NoncesPerMAC-1, r.NoncesPerMAC)
		if err != nil {
			return deleted, err
		}
		type cut struct {
			mac string
			at  int64
		}
		var cuts []cut
		for rows.Next() {
			var c cut
			if err := rows.Scan(&c.mac, &c.at); err != nil {
				rows.Close()
				return deleted, err
			}
			cuts = append(cuts, c)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return deleted, err
		}
		for _, c := range cuts {
			if deleted >= batch {
				break
			}
			n, err := s.deleteIDs(ctx, "boot_nonces", "rowid", `SELECT rowid FROM boot_nonces
				WHERE mac = ? AND rowid < ? AND (csr_sha256 = '' OR used_at IS NOT NULL) ORDER BY rowid`,
				batch-deleted, c.mac, c.at)
			if err != nil {
				return deleted, err
			}
			deleted += n
		}
	}
	if r.MaxTotal > 0 && deleted < batch {
		var total int
		if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM boot_nonces`).Scan(&total); err != nil {
			return deleted, err
		}
		if over := total - r.MaxTotal; over > 0 {
			n, err := s.deleteIDs(ctx, "boot_nonces", "rowid", `SELECT rowid FROM boot_nonces ORDER BY rowid`, min(over, batch-deleted))
			if err != nil {
				return deleted, err
			}
			deleted += n
		}
	}
	return deleted, nil
}
