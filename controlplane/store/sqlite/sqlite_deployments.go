package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

const deploymentColumns = `id, machine_id, spec, step, deadline, boot_attempts, deploy_attempts, deploy_failures, bmc_attempts, command_id,
	ramdisk_node, node_id, token_id, lost_at, node_session, node_boot_id, outcome, version, created_at, updated_at, finished_at, left_ramdisk`

func scanDeployment(sc interface{ Scan(...any) error }) (store.Deployment, error) {
	var d store.Deployment
	var spec string
	var deadline, lost, created, updated, finished sql.NullInt64
	if err := sc.Scan(&d.ID, &d.MachineID, &spec, &d.Step, &deadline, &d.BootAttempts, &d.DeployAttempts, &d.DeployFailures, &d.BMCAttempts,
		&d.CommandID, &d.RamdiskNode, &d.NodeID, &d.TokenID, &lost, &d.NodeSession, &d.NodeBootID, &d.Outcome, &d.Version,
		&created, &updated, &finished, &d.LeftRamdisk); err != nil {
		return store.Deployment{}, err
	}
	if err := json.Unmarshal([]byte(spec), &d.Spec); err != nil {
		return store.Deployment{}, fmt.Errorf("deployment %s: spec: %w", d.ID, err)
	}
	d.Deadline, d.LostAt, d.CreatedAt, d.UpdatedAt, d.FinishedAt = fromMS(deadline), fromMS(lost), fromMS(created), fromMS(updated), fromMS(finished)
	return d, nil
}

func (s *sqliteStore) StartDeployment(ctx context.Context, d store.Deployment, ch store.DeploymentChange) (store.Deployment, error) {
	spec, err := json.Marshal(d.Spec)
	if err != nil {
		return d, fmt.Errorf("store: deployment spec: %w", err)
	}
	d.Version, d.CreatedAt, d.UpdatedAt = 1, ch.At, ch.At
	err = s.tx(ctx, func(tx *sql.Tx) error {
		var current string
		if err := tx.QueryRowContext(ctx, `SELECT deployment FROM machines WHERE id = ?`, d.MachineID).Scan(&current); err != nil {
			return err
		}
		if current != "" {
			var finished sql.NullInt64
			var token string
			err := tx.QueryRowContext(ctx, `SELECT finished_at, token_id FROM deployments WHERE id = ?`, current).Scan(&finished, &token)
			switch {
			case errors.Is(err, sql.ErrNoRows):
			case err != nil:
				return err
			case !finished.Valid:
				return fmt.Errorf("deployment %s: %w", current, store.ErrDeploymentActive)
			case token != "":
				ch.RevokeTokens = append(ch.RevokeTokens, token)
			}
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO deployments (`+deploymentColumns+`)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			d.ID, d.MachineID, string(spec), d.Step, ms(d.Deadline), d.BootAttempts, d.DeployAttempts, d.DeployFailures, d.BMCAttempts, d.CommandID,
			d.RamdiskNode, d.NodeID, d.TokenID, ms(d.LostAt), d.NodeSession, d.NodeBootID, d.Outcome, d.Version,
			ms(d.CreatedAt), ms(d.UpdatedAt), ms(d.FinishedAt), d.LeftRamdisk); err != nil {
			return err
		}
		// The deploy hands the boot mode to the lifecycle: the operator's
		// override would otherwise win again once the deployment ends.
		var site, override string
		if err := tx.QueryRowContext(ctx, `SELECT site, boot_override FROM machines WHERE id = ?`, d.MachineID).Scan(&site, &override); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE machines SET deployment = ?, boot_override = '', updated_at = ? WHERE id = ?`,
			d.ID, ms(ch.At), d.MachineID); err != nil {
			return err
		}
		if override != "" {
			if err := bumpSpec(ctx, tx, site, ch.At); err != nil {
				return err
			}
		}
		return applyChange(ctx, tx, d.MachineID, d.ID, ch)
	})
	if isConstraint(err) {
		return d, fmt.Errorf("store: deployment %s: %w", d.ID, store.ErrExists)
	}
	if ch.Finish != "" {
		d.Outcome, d.FinishedAt = ch.Finish, ch.At
	}
	return d, wrap("start deployment of "+d.MachineID, err)
}

func (s *sqliteStore) GetDeployment(ctx context.Context, id string) (store.Deployment, error) {
	d, err := scanDeployment(s.r.QueryRowContext(ctx, `SELECT `+deploymentColumns+` FROM deployments WHERE id = ?`, id))
	return d, wrap("deployment "+id, err)
}

func (s *sqliteStore) OpenDeployments(ctx context.Context) ([]store.Deployment, error) {
	return queryAll(ctx, s.r, "open deployments", scanDeployment, `SELECT `+deploymentColumns+` FROM deployments WHERE finished_at IS NULL ORDER BY created_at, id`)
}

func (s *sqliteStore) AdvanceDeployment(ctx context.Context, d store.Deployment, ch store.DeploymentChange) (store.Deployment, error) {
	if ch.Finish != "" {
		d.Outcome, d.FinishedAt = ch.Finish, ch.At
	}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE deployments SET step = ?, deadline = ?, boot_attempts = ?, deploy_attempts = ?,
			deploy_failures = ?, bmc_attempts = ?, command_id = ?, ramdisk_node = ?, left_ramdisk = ?, node_id = ?, token_id = ?, lost_at = ?,
			node_session = ?, node_boot_id = ?, outcome = ?, finished_at = ?, version = version + 1, updated_at = ?
			WHERE id = ? AND version = ?`,
			d.Step, ms(d.Deadline), d.BootAttempts, d.DeployAttempts, d.DeployFailures, d.BMCAttempts, d.CommandID, d.RamdiskNode, d.LeftRamdisk,
			d.NodeID, d.TokenID, ms(d.LostAt), d.NodeSession, d.NodeBootID, d.Outcome, ms(d.FinishedAt), ms(ch.At), d.ID, d.Version)
		if err != nil {
			return err
		}
		if n, err := rowsAffected(res); err != nil || n != 1 {
			if err != nil {
				return err
			}
			var one int
			if err := tx.QueryRowContext(ctx, `SELECT 1 FROM deployments WHERE id = ?`, d.ID).Scan(&one); err != nil {
				return err
			}
			return store.ErrConflict
		}
		return applyChange(ctx, tx, d.MachineID, d.ID, ch)
	})
	if err != nil {
		return d, wrap("advance deployment "+d.ID, err)
	}
	d.Version++
	d.UpdatedAt = ch.At
	return d, nil
}

// applyChange writes what a lifecycle step changes besides its deployment,
// within tx.
func applyChange(ctx context.Context, tx *sql.Tx, machineID, deploymentID string, ch store.DeploymentChange) error {
	var site, state, mode string
	if err := tx.QueryRowContext(ctx, `SELECT site, state, boot_mode FROM machines WHERE id = ?`, machineID).Scan(&site, &state, &mode); err != nil {
		return err
	}
	if ch.Adopt != nil {
		if err := adoptBindings(ctx, tx, machineID, *ch.Adopt); err != nil {
			return err
		}
	}
	if ch.State != "" {
		if _, err := tx.ExecContext(ctx, `UPDATE machines SET state = ?, state_reason = ?, state_changed_at = ?, updated_at = ?
			WHERE id = ?`, ch.State, ch.Reason, ms(ch.At), ms(ch.At), machineID); err != nil {
			return err
		}
		data, _ := json.Marshal(struct {
			From       string `json:"from"`
			To         string `json:"to"`
			Reason     string `json:"reason,omitempty"`
			Deployment string `json:"deployment"`
		}{state, ch.State, ch.Reason, deploymentID})
		msg := ch.State
		if ch.Reason != "" {
			msg += ": " + ch.Reason
		}
		if err := addMachineEvent(ctx, tx, store.MachineEvent{MachineID: machineID, Time: ch.At, Kind: protocol.MachineEventState, Message: msg, Data: data}); err != nil {
			return err
		}
	}
	if ch.BootMode != nil && *ch.BootMode != mode {
		if _, err := tx.ExecContext(ctx, `UPDATE machines SET boot_mode = ?, updated_at = ? WHERE id = ?`, *ch.BootMode, ms(ch.At), machineID); err != nil {
			return err
		}
		if err := bumpSpec(ctx, tx, site, ch.At); err != nil {
			return err
		}
	}
	for _, id := range ch.RevokeTokens {
		if _, err := tx.ExecContext(ctx, `UPDATE join_tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL AND used_at IS NULL`,
			ms(ch.At), id); err != nil {
			return err
		}
	}
	for _, t := range ch.Tokens {
		if err := insertToken(ctx, tx, t); err != nil {
			return err
		}
	}
	for _, e := range ch.Events {
		e.MachineID = machineID
		if e.Time.IsZero() {
			e.Time = ch.At
		}
		if err := addMachineEvent(ctx, tx, e); err != nil {
			return err
		}
	}
	for _, c := range ch.Commands {
		if err := insertCommand(ctx, tx, c); err != nil {
			return err
		}
	}
	return nil
}

func (s *sqliteStore) FindMachineByNode(ctx context.Context, nodeID string) (store.Machine, error) {
	if nodeID == "" {
		return store.Machine{}, fmt.Errorf("store: machine of node: %w", store.ErrNotFound)
	}
	m, err := scanMachine(s.r.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines
		WHERE node = ? OR ramdisk_node = ? OR bound_node = ? OR bound_ramdisk = ?
		ORDER BY updated_at DESC LIMIT 1`, nodeID, nodeID, nodeID, nodeID))
	return m, wrap("machine of node "+nodeID, err)
}

func (s *sqliteStore) ListMachinesWithPendingBindings(ctx context.Context) ([]store.Machine, error) {
	return s.queryMachines(ctx, "machines with bindings to adopt", `WHERE bind_seq != bind_applied`)
}

func (s *sqliteStore) ListMachinesInState(ctx context.Context, state string) ([]store.Machine, error) {
	return s.queryMachines(ctx, "machines in state "+state, `WHERE state = ?`, state)
}
