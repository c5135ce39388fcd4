package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

const commandColumns = `id, node_id, kind, params, state, reason, message, progress, result, created_at, updated_at, sent_at, machine_id`

func scanCommand(sc interface{ Scan(...any) error }) (store.Command, error) {
	var c store.Command
	var params, progress, result sql.NullString
	var created, updated, sent sql.NullInt64
	if err := sc.Scan(&c.ID, &c.NodeID, &c.Kind, &params, &c.State, &c.Reason, &c.Message, &progress, &result,
		&created, &updated, &sent, &c.MachineID); err != nil {
		return store.Command{}, err
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

func (s *sqliteStore) CreateCommand(ctx context.Context, c store.Command) error {
	err := s.tx(ctx, func(tx *sql.Tx) error { return insertCommand(ctx, tx, c) })
	if isConstraint(err) {
		return fmt.Errorf("store: command %s: %w", c.ID, store.ErrExists)
	}
	return wrap("create command", err)
}

// insertCommand writes a command and, for one about a machine, its event on
// the machine's timeline, within tx.
func insertCommand(ctx context.Context, tx *sql.Tx, c store.Command) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO commands (`+commandColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.ID, c.NodeID, c.Kind, nullJSON(c.Params), c.State, c.Reason, c.Message, nullJSON(c.Progress), nullJSON(c.Result),
		ms(c.CreatedAt), ms(c.UpdatedAt), ms(c.SentAt), c.MachineID); err != nil {
		return err
	}
	if c.MachineID == "" {
		return nil
	}
	// The params stay off the timeline: a deploy's carry a join token.
	data, _ := json.Marshal(map[string]string{"kind": c.Kind, "node": c.NodeID})
	return addMachineEvent(ctx, tx, store.MachineEvent{MachineID: c.MachineID, Time: c.CreatedAt, Kind: protocol.MachineEventCommand,
		Message: c.Kind + " for node " + c.NodeID, NodeID: c.NodeID, CommandID: c.ID, Data: data})
}

func (s *sqliteStore) GetCommand(ctx context.Context, id string) (store.Command, error) {
	c, err := scanCommand(s.r.QueryRowContext(ctx, `SELECT `+commandColumns+` FROM commands WHERE id = ?`, id))
	return c, wrap("command "+id, err)
}

func (s *sqliteStore) OpenCommands(ctx context.Context, nodeID string) ([]store.Command, error) {
	return queryAll(ctx, s.r, "open commands", scanCommand, `SELECT `+commandColumns+` FROM commands
		WHERE node_id = ? AND state NOT IN ('SUCCEEDED', 'FAILED', 'UNSUPPORTED') ORDER BY id`, nodeID)
}

func (s *sqliteStore) MarkSent(ctx context.Context, id string, at time.Time) error {
	_, err := s.exec(ctx, `UPDATE commands SET sent_at = ?,
		state = CASE state WHEN 'PENDING' THEN 'SENT' ELSE state END, updated_at = ? WHERE id = ?`, ms(at), ms(at), id)
	return wrap("mark command sent", err)
}

// progressEvery thins a command's RUNNING reports on its machine's timeline:
// a deploy reports progress every second or so, the timeline keeps one
// every few seconds.
const progressEvery = 5 * time.Second

// maxEventResult bounds the result a status event carries on the timeline.
const maxEventResult = 4 << 10

func (s *sqliteStore) ApplyStatus(ctx context.Context, u store.StatusUpdate) (bool, error) {
	applied := false
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var kind, machine, prev string
		err := tx.QueryRowContext(ctx, `SELECT kind, machine_id, state FROM commands
			WHERE id = ? AND node_id = ? AND state NOT IN ('SUCCEEDED', 'FAILED', 'UNSUPPORTED')`,
			u.CommandID, u.NodeID).Scan(&kind, &machine, &prev)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE commands SET state = ?, reason = ?, message = ?,
			progress = COALESCE(?, progress), result = COALESCE(?, result), updated_at = ? WHERE id = ?`,
			u.State, u.Reason, u.Message, nullJSON(u.Progress), nullJSON(u.Result), ms(u.At), u.CommandID); err != nil {
			return err
		}
		applied = true
		if machine == "" {
			return nil
		}
		if kind == protocol.KindInventory && u.State == protocol.StateSucceeded && json.Valid(u.Result) && bytes.HasPrefix(bytes.TrimSpace(u.Result), []byte("{")) {
			if _, err := tx.ExecContext(ctx, `UPDATE machines SET inventory = ?, inventory_at = ?, updated_at = ? WHERE id = ?`,
				string(u.Result), ms(u.At), ms(u.At), machine); err != nil {
				return err
			}
		}
		if u.State == prev {
			// The first report with progress is kept whatever came just
			// before it (a deploy's "started"), so the timeline has the
			// transfer from its start.
			var last int64
			var lastData sql.NullString
			err := tx.QueryRowContext(ctx, `SELECT time, data FROM machine_events WHERE command_id = ? ORDER BY id DESC LIMIT 1`,
				u.CommandID).Scan(&last, &lastData)
			switch {
			case errors.Is(err, sql.ErrNoRows):
			case err != nil:
				return err
			case len(u.Progress) > 0 && !strings.Contains(lastData.String, `"progress"`):
			case u.At.Sub(time.UnixMilli(last)) < progressEvery:
				return nil
			}
		}
		ev := map[string]any{"kind": kind, "state": u.State}
		if u.Reason != "" {
			ev["reason"] = u.Reason
		}
		if u.Message != "" {
			ev["message"] = u.Message
		}
		if len(u.Progress) > 0 {
			ev["progress"] = json.RawMessage(u.Progress)
		}
		if len(u.Result) > 0 && len(u.Result) <= maxEventResult && kind != protocol.KindInventory && json.Valid(u.Result) {
			ev["result"] = json.RawMessage(u.Result)
		}
		data, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		msg := kind + " " + u.State
		if u.Reason != "" {
			msg += ": " + u.Reason
		}
		if u.Message != "" {
			msg += ": " + u.Message
		}
		return addMachineEvent(ctx, tx, store.MachineEvent{MachineID: machine, Time: u.At, Kind: protocol.MachineEventCommandStatus,
			Message: msg, NodeID: u.NodeID, CommandID: u.CommandID, Data: data})
	})
	return applied, wrap("apply status", err)
}
