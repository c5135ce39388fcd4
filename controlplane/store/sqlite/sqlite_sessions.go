package sqlite

import (
	"context"
	"database/sql"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
)

func (s *sqliteStore) OpenSession(ctx context.Context, se store.Session) (int64, error) {
	var id int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO node_sessions (node_id, role, daemon_version, boot_id,
			protocol_version, remote_addr, connected_at, daemon_arch) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			se.NodeID, se.Role, se.DaemonVersion, se.BootID, se.ProtocolVersion, se.RemoteAddr, ms(se.ConnectedAt), se.DaemonArch)
		if err != nil {
			return err
		}
		if id, err = res.LastInsertId(); err != nil {
			return err
		}
		if err := updateLiveNode(ctx, tx, se.NodeID, `last_seen_at = ?`, ms(se.ConnectedAt)); err != nil {
			return err
		}
		// Of two sessions that race, the later one is the node's. An agent
		// that does not say its arch (an older bcd) leaves the one known.
		_, err = tx.ExecContext(ctx, `UPDATE nodes SET session_id = ?, daemon_version = ?,
			daemon_arch = CASE ? WHEN '' THEN daemon_arch ELSE ? END
			WHERE id = ? AND (session_id IS NULL OR session_id < ?)`, id, se.DaemonVersion, se.DaemonArch, se.DaemonArch, se.NodeID, id)
		return err
	})
	return id, wrap("open session of "+se.NodeID, err)
}

func (s *sqliteStore) CloseSession(ctx context.Context, id int64, at time.Time) error {
	return wrap("close session", s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE node_sessions SET disconnected_at = ? WHERE id = ? AND disconnected_at IS NULL`,
			ms(at), id); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE nodes SET session_id = NULL, last_seen_at = ? WHERE session_id = ?`, ms(at), id)
		return err
	}))
}

func (s *sqliteStore) CloseAllSessions(ctx context.Context, at time.Time) error {
	return wrap("close sessions", s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `UPDATE node_sessions SET disconnected_at = ? WHERE disconnected_at IS NULL`, ms(at)); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `UPDATE nodes SET session_id = NULL WHERE session_id IS NOT NULL`)
		return err
	}))
}

func (s *sqliteStore) GetSession(ctx context.Context, id int64) (store.Session, error) {
	var se store.Session
	var connected, disconnected sql.NullInt64
	err := s.r.QueryRowContext(ctx, `SELECT id, node_id, role, daemon_version, boot_id, protocol_version, remote_addr,
		connected_at, disconnected_at, daemon_arch FROM node_sessions WHERE id = ?`, id).Scan(&se.ID, &se.NodeID, &se.Role, &se.DaemonVersion,
		&se.BootID, &se.ProtocolVersion, &se.RemoteAddr, &connected, &disconnected, &se.DaemonArch)
	se.ConnectedAt, se.DisconnectedAt = fromMS(connected), fromMS(disconnected)
	return se, wrap("session", err)
}

func (s *sqliteStore) AddEvent(ctx context.Context, e store.Event) error {
	var session any
	if e.SessionID != 0 {
		session = e.SessionID
	}
	_, err := s.exec(ctx, `INSERT INTO events (node_id, session_id, seq, kind, time, level, message, data, received_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		e.NodeID, session, int64(e.Seq), e.Kind, e.Time.UnixMilli(), e.Level, e.Message, nullJSON(e.Data), ms(e.ReceivedAt))
	return wrap("add event", err)
}
