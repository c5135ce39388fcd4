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
)

const releaseColumns = `version, product, sequence, expires, manifest, url_base, binaries, added_at`

func scanRelease(sc interface{ Scan(...any) error }) (store.Release, error) {
	var r store.Release
	var expires, added sql.NullInt64
	var binaries string
	if err := sc.Scan(&r.Version, &r.Product, &r.Sequence, &expires, &r.Manifest, &r.URLBase, &binaries, &added); err != nil {
		return store.Release{}, err
	}
	if err := json.Unmarshal([]byte(binaries), &r.Binaries); err != nil {
		return store.Release{}, fmt.Errorf("release %s: binaries: %w", r.Version, err)
	}
	r.Expires, r.AddedAt = fromMS(expires), fromMS(added)
	return r, nil
}

func (s *sqliteStore) AddRelease(ctx context.Context, r store.Release) (store.Release, bool, error) {
	r.Version = strings.TrimPrefix(r.Version, "v")
	added := false
	var out store.Release
	err := s.tx(ctx, func(tx *sql.Tx) error {
		old, err := scanRelease(tx.QueryRowContext(ctx, `SELECT `+releaseColumns+` FROM releases WHERE version = ?`, r.Version))
		switch {
		case err == nil:
			if old.Manifest != r.Manifest {
				return fmt.Errorf("release %s: %w with another manifest", r.Version, store.ErrExists)
			}
			out = old
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		binaries, err := json.Marshal(r.Binaries)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO releases (`+releaseColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			r.Version, r.Product, r.Sequence, ms(r.Expires), r.Manifest, r.URLBase, string(binaries), ms(r.AddedAt)); err != nil {
			return err
		}
		added, out = true, r
		return nil
	})
	return out, added, wrap("add release", err)
}

func (s *sqliteStore) GetRelease(ctx context.Context, version string) (store.Release, error) {
	r, err := scanRelease(s.r.QueryRowContext(ctx, `SELECT `+releaseColumns+` FROM releases WHERE version = ?`,
		strings.TrimPrefix(version, "v")))
	return r, wrap("release "+version, err)
}

func (s *sqliteStore) ListReleases(ctx context.Context) ([]store.Release, error) {
	return queryAll(ctx, s.r, "list releases", scanRelease, `SELECT `+releaseColumns+` FROM releases ORDER BY sequence DESC, version`)
}

func (s *sqliteStore) SetDaemonTarget(ctx context.Context, t store.DaemonTarget, at time.Time) (store.Node, error) {
	var n store.Node
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if err := setDaemonTarget(ctx, tx, t, at); err != nil {
			return err
		}
		var err error
		n, err = scanNode(tx.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE id = ?`, t.NodeID))
		return err
	})
	return n, wrap("daemon target of node "+t.NodeID, err)
}

// setDaemonTarget sets or clears a node's daemon target within tx; a clear
// whose IfVersion is not the target's changes nothing.
func setDaemonTarget(ctx context.Context, tx *sql.Tx, t store.DaemonTarget, at time.Time) error {
	if t.Section == nil {
		if t.IfVersion != "" {
			var cur string
			err := tx.QueryRowContext(ctx, `SELECT daemon_target_version FROM nodes WHERE id = ?`, t.NodeID).Scan(&cur)
			if err != nil {
				return err
			}
			if cur != t.IfVersion {
				return nil
			}
		}
		return updateLiveNode(ctx, tx, t.NodeID, `daemon_target = NULL, daemon_target_version = '',
			spec_revision = spec_revision + 1, updated_at = ?`, ms(at))
	}
	b, err := json.Marshal(t.Section)
	if err != nil {
		return err
	}
	return updateLiveNode(ctx, tx, t.NodeID, `daemon_target = ?, daemon_target_version = ?,
		spec_revision = spec_revision + 1, updated_at = ?`, string(b), t.Section.Version, ms(at))
}

const sectionColumns = `node_id, section, state, reason, message, version, revision, at, received_at`

func scanSection(sc interface{ Scan(...any) error }) (store.SectionStatus, error) {
	var st store.SectionStatus
	var at, received sql.NullInt64
	err := sc.Scan(&st.NodeID, &st.Section, &st.State, &st.Reason, &st.Message, &st.Version, &st.Revision, &at, &received)
	st.At, st.ReceivedAt = fromMS(at), fromMS(received)
	return st, err
}

func (s *sqliteStore) ApplySectionStatus(ctx context.Context, st store.SectionStatus) (bool, error) {
	res, err := s.exec(ctx, `INSERT INTO node_section_status (`+sectionColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (node_id, section) DO UPDATE SET state = excluded.state, reason = excluded.reason,
			message = excluded.message, version = excluded.version, revision = excluded.revision, at = excluded.at,
			received_at = excluded.received_at
		WHERE excluded.revision > node_section_status.revision
			OR excluded.revision = node_section_status.revision AND excluded.at >= node_section_status.at`,
		st.NodeID, st.Section, st.State, st.Reason, st.Message, st.Version, st.Revision, ms(st.At), ms(st.ReceivedAt))
	if err != nil {
		return false, wrap("apply section status", err)
	}
	n, err := rowsAffected(res)
	return n == 1, wrap("apply section status", err)
}

func (s *sqliteStore) GetSectionStatus(ctx context.Context, nodeID, section string) (store.SectionStatus, error) {
	st, err := scanSection(s.r.QueryRowContext(ctx, `SELECT `+sectionColumns+` FROM node_section_status
		WHERE node_id = ? AND section = ?`, nodeID, section))
	return st, wrap("section status", err)
}

func (s *sqliteStore) ListSectionStatuses(ctx context.Context, section string) ([]store.SectionStatus, error) {
	return queryAll(ctx, s.r, "list section statuses", scanSection, `SELECT `+sectionColumns+` FROM node_section_status
		WHERE section = ? ORDER BY node_id`, section)
}

const rolloutColumns = `id, version, role, pool, site, waves, max_unavailable, failure_threshold, wave_timeout_ms, state, reason,
	revision, created_at, updated_at`

func scanRollout(sc interface{ Scan(...any) error }) (store.Rollout, error) {
	var r store.Rollout
	var waves string
	var timeout int64
	var created, updated sql.NullInt64
	if err := sc.Scan(&r.ID, &r.Version, &r.Role, &r.Pool, &r.Site, &waves, &r.MaxUnavailable, &r.FailureThreshold, &timeout,
		&r.State, &r.Reason, &r.Revision, &created, &updated); err != nil {
		return store.Rollout{}, err
	}
	if err := json.Unmarshal([]byte(waves), &r.Waves); err != nil {
		return store.Rollout{}, fmt.Errorf("rollout %s: waves: %w", r.ID, err)
	}
	r.WaveTimeout = time.Duration(timeout) * time.Millisecond
	r.CreatedAt, r.UpdatedAt = fromMS(created), fromMS(updated)
	return r, nil
}

const rolloutNodeColumns = `node_id, pool, wave, state, reason, message, command_id, started_at, finished_at`

func scanRolloutNode(sc interface{ Scan(...any) error }) (store.RolloutNode, error) {
	var n store.RolloutNode
	var started, finished sql.NullInt64
	err := sc.Scan(&n.NodeID, &n.Pool, &n.Wave, &n.State, &n.Reason, &n.Message, &n.CommandID, &started, &finished)
	n.StartedAt, n.FinishedAt = fromMS(started), fromMS(finished)
	return n, err
}

func scanRolloutEvent(sc interface{ Scan(...any) error }) (store.RolloutEvent, error) {
	var e store.RolloutEvent
	var at sql.NullInt64
	err := sc.Scan(&at, &e.Message)
	e.At = fromMS(at)
	return e, err
}

func (s *sqliteStore) CreateRollout(ctx context.Context, r store.Rollout) error {
	return wrap("create rollout", s.tx(ctx, func(tx *sql.Tx) error {
		other, err := scanRollout(tx.QueryRowContext(ctx, `SELECT `+rolloutColumns+` FROM rollouts
			WHERE state IN ('running', 'paused') AND role = ? AND (pool = ? OR pool = '' OR ? = '')
			AND (site = ? OR site = '' OR ? = '') ORDER BY created_at LIMIT 1`, r.Role, r.Pool, r.Pool, r.Site, r.Site))
		switch {
		case err == nil:
			return &store.ActiveRolloutError{Rollout: other}
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		waves, err := json.Marshal(r.Waves)
		if err != nil {
			return err
		}
		if r.Revision == 0 {
			r.Revision = 1
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO rollouts (`+rolloutColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			r.ID, r.Version, r.Role, r.Pool, r.Site, string(waves), r.MaxUnavailable, r.FailureThreshold, r.WaveTimeout.Milliseconds(),
			r.State, r.Reason, r.Revision, ms(r.CreatedAt), ms(r.UpdatedAt)); err != nil {
			if isConstraint(err) {
				return store.ErrExists
			}
			return err
		}
		for _, n := range r.Nodes {
			if _, err := tx.ExecContext(ctx, `INSERT INTO rollout_nodes (rollout_id, `+rolloutNodeColumns+`)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, r.ID, n.NodeID, n.Pool, n.Wave, n.State, n.Reason, n.Message, n.CommandID,
				ms(n.StartedAt), ms(n.FinishedAt)); err != nil {
				return err
			}
		}
		return addRolloutEvents(ctx, tx, r.ID, r.Timeline)
	}))
}

func addRolloutEvents(ctx context.Context, tx *sql.Tx, id string, evs []store.RolloutEvent) error {
	for _, e := range evs {
		if _, err := tx.ExecContext(ctx, `INSERT INTO rollout_events (rollout_id, at, message) VALUES (?, ?, ?)`,
			id, ms(e.At), e.Message); err != nil {
			return err
		}
	}
	return nil
}

func (s *sqliteStore) rolloutNodes(ctx context.Context, id string) ([]store.RolloutNode, error) {
	return queryAll(ctx, s.r, "rollout nodes", scanRolloutNode, `SELECT `+rolloutNodeColumns+` FROM rollout_nodes
		WHERE rollout_id = ? ORDER BY wave, node_id`, id)
}

func (s *sqliteStore) GetRollout(ctx context.Context, id string) (store.Rollout, error) {
	r, err := scanRollout(s.r.QueryRowContext(ctx, `SELECT `+rolloutColumns+` FROM rollouts WHERE id = ?`, id))
	if err != nil {
		return r, wrap("rollout "+id, err)
	}
	if r.Nodes, err = s.rolloutNodes(ctx, id); err != nil {
		return r, err
	}
	r.Timeline, err = queryAll(ctx, s.r, "rollout timeline", scanRolloutEvent, `SELECT at, message FROM rollout_events
		WHERE rollout_id = ? ORDER BY id`, id)
	return r, err
}

func (s *sqliteStore) ListRollouts(ctx context.Context) ([]store.Rollout, error) {
	return queryAll(ctx, s.r, "list rollouts", scanRollout, `SELECT `+rolloutColumns+` FROM rollouts ORDER BY created_at DESC, id DESC`)
}

func (s *sqliteStore) ListActiveRollouts(ctx context.Context) ([]store.Rollout, error) {
	rs, err := queryAll(ctx, s.r, "list active rollouts", scanRollout, `SELECT `+rolloutColumns+` FROM rollouts
		WHERE state IN ('running', 'paused') ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	for i := range rs {
		if rs[i].Nodes, err = s.rolloutNodes(ctx, rs[i].ID); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

func (s *sqliteStore) StepRollout(ctx context.Context, st store.RolloutStep) error {
	return wrap("step rollout "+st.RolloutID, s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE rollouts SET state = ?, reason = ?, revision = revision + 1, updated_at = ?
			WHERE id = ? AND revision = ?`, st.State, st.Reason, ms(st.At), st.RolloutID, st.Revision)
		if err != nil {
			return err
		}
		n, err := rowsAffected(res)
		if err != nil {
			return err
		}
		if n != 1 {
			var one int
			if err := tx.QueryRowContext(ctx, `SELECT 1 FROM rollouts WHERE id = ?`, st.RolloutID).Scan(&one); err != nil {
				return err
			}
			return store.ErrRolloutChanged
		}
		for _, n := range st.Nodes {
			res, err := tx.ExecContext(ctx, `UPDATE rollout_nodes SET state = ?, reason = ?, message = ?, command_id = ?,
				started_at = ?, finished_at = ? WHERE rollout_id = ? AND node_id = ?`,
				n.State, n.Reason, n.Message, n.CommandID, ms(n.StartedAt), ms(n.FinishedAt), st.RolloutID, n.NodeID)
			if err != nil {
				return err
			}
			if k, err := rowsAffected(res); err != nil || k != 1 {
				return errors.Join(err, fmt.Errorf("node %s is not in the rollout: %w", n.NodeID, store.ErrNotFound))
			}
		}
		for _, t := range st.Targets {
			if err := setDaemonTarget(ctx, tx, t, st.At); err != nil {
				return fmt.Errorf("daemon target of node %s: %w", t.NodeID, err)
			}
		}
		for _, c := range st.Commands {
			if err := insertCommand(ctx, tx, c); err != nil {
				return err
			}
		}
		return addRolloutEvents(ctx, tx, st.RolloutID, st.Timeline)
	}))
}
