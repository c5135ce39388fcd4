package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

const commandColumns = `id, node_id, kind, params, state, reason, message, progress, result, created_at, updated_at, sent_at`

func scanCommand(sc interface{ Scan(...any) error }) (Command, error) {
	var c Command
	var params, progress, result sql.NullString
	var created, updated, sent sql.NullInt64
	if err := sc.Scan(&c.ID, &c.NodeID, &c.Kind, &params, &c.State, &c.Reason, &c.Message, &progress, &result,
		&created, &updated, &sent); err != nil {
		return Command{}, err
	}
	if params.Valid {
		c.Params = []byte(params.String)
	}
	if progress.Valid {
		c.Progress = []byte(progress.String)
	}
	if result.Valid {
		c.Result = []byte(result.String)
	}
	c.CreatedAt, c.UpdatedAt, c.SentAt = fromMS(created), fromMS(updated), fromMS(sent)
	return c, nil
}

func (s *sqliteStore) CreateCommand(ctx context.Context, c Command) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO commands (`+commandColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.ID, c.NodeID, c.Kind, nullJSON(c.Params), c.State, c.Reason, c.Message, nullJSON(c.Progress), nullJSON(c.Result),
		ms(c.CreatedAt), ms(c.UpdatedAt), ms(c.SentAt))
	if isConstraint(err) {
		return fmt.Errorf("store: command %s: %w", c.ID, ErrExists)
	}
	return wrap("create command", err)
}

func (s *sqliteStore) GetCommand(ctx context.Context, id string) (Command, error) {
	c, err := scanCommand(s.r.QueryRowContext(ctx, `SELECT `+commandColumns+` FROM commands WHERE id = ?`, id))
	return c, wrap("command "+id, err)
}

func (s *sqliteStore) OpenCommands(ctx context.Context, nodeID string) ([]Command, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+commandColumns+` FROM commands
		WHERE node_id = ? AND state NOT IN ('SUCCEEDED', 'FAILED', 'UNSUPPORTED') ORDER BY id`, nodeID)
	if err != nil {
		return nil, wrap("open commands", err)
	}
	defer rows.Close()
	var out []Command
	for rows.Next() {
		c, err := scanCommand(rows)
		if err != nil {
			return nil, wrap("open commands", err)
		}
		out = append(out, c)
	}
	return out, wrap("open commands", rows.Err())
}

func (s *sqliteStore) MarkSent(ctx context.Context, id string, at time.Time) error {
	_, err := s.w.ExecContext(ctx, `UPDATE commands SET sent_at = ?,
		state = CASE state WHEN 'PENDING' THEN 'SENT' ELSE state END, updated_at = ? WHERE id = ?`, ms(at), ms(at), id)
	return wrap("mark command sent", err)
}

func (s *sqliteStore) ApplyStatus(ctx context.Context, u StatusUpdate) (bool, error) {
	res, err := s.w.ExecContext(ctx, `UPDATE commands SET state = ?, reason = ?, message = ?,
		progress = COALESCE(?, progress), result = COALESCE(?, result), updated_at = ?
		WHERE id = ? AND node_id = ? AND state NOT IN ('SUCCEEDED', 'FAILED', 'UNSUPPORTED')`,
		u.State, u.Reason, u.Message, nullJSON(u.Progress), nullJSON(u.Result), ms(u.At), u.CommandID, u.NodeID)
	if err != nil {
		return false, wrap("apply status", err)
	}
	n, err := rowsAffected(res)
	return n == 1, wrap("apply status", err)
}
