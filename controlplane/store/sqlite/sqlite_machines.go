package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/protocol"
)

const machineColumns = `id, name, site, boot_mode, bmc_address, bmc_port, bmc_username, bmc_password, bmc_cipher_suite,
	state, state_reason, state_changed_at, ramdisk_node, node, inventory, inventory_at, approved, last_boot_stage,
	last_boot_at, created_at, updated_at, firmware, deployment, boot_override, bound_ramdisk, bound_node, bind_seq, bind_applied,
	(SELECT group_concat(mac, ',' ORDER BY rowid) FROM machine_macs WHERE machine_id = machines.id),
	coalesce((SELECT ek_sha256 FROM tpm_enrollments WHERE machine_id = machines.id), ''),
	coalesce((SELECT pool FROM tpm_enrollments WHERE machine_id = machines.id), '')`

func scanMachine(sc interface{ Scan(...any) error }) (store.Machine, error) {
	var m store.Machine
	var name, inventory, macs sql.NullString
	var bmc store.MachineBMC
	var stateChanged, inventoryAt, lastBoot, created, updated sql.NullInt64
	if err := sc.Scan(&m.ID, &name, &m.Site, &m.BootMode, &bmc.Address, &bmc.Port, &bmc.Username, &bmc.Password, &bmc.CipherSuite,
		&m.State, &m.StateReason, &stateChanged, &m.RamdiskNode, &m.Node, &inventory, &inventoryAt, &m.Approved,
		&m.LastBootStage, &lastBoot, &created, &updated, &m.Firmware, &m.Deployment, &m.BootOverride, &m.BoundRamdisk, &m.BoundNode,
		&m.BindSeq, &m.BindApplied, &macs, &m.TPMEKSHA256, &m.TPMPool); err != nil {
		return store.Machine{}, err
	}
	m.Name = name.String
	if bmc.Address != "" {
		m.BMC = &bmc
	}
	if inventory.Valid {
		m.Inventory = []byte(inventory.String)
	}
	if macs.String != "" {
		m.MACs = strings.Split(macs.String, ",")
	}
	m.StateChangedAt, m.InventoryAt, m.LastBootAt = fromMS(stateChanged), fromMS(inventoryAt), fromMS(lastBoot)
	m.CreatedAt, m.UpdatedAt = fromMS(created), fromMS(updated)
	return m, nil
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func bmcColumns(b *store.MachineBMC) []any {
	if b == nil {
		return []any{"", 0, "", "", 0}
	}
	return []any{b.Address, b.Port, b.Username, b.Password, b.CipherSuite}
}

func (s *sqliteStore) CreateMachine(ctx context.Context, m store.Machine) error {
	return wrap("create machine "+m.ID, s.tx(ctx, func(tx *sql.Tx) error {
		if m.Name != "" {
			var other string
			err := tx.QueryRowContext(ctx, `SELECT id FROM machines WHERE site = ? AND name = ?`, m.Site, m.Name).Scan(&other)
			if err == nil {
				return &store.ConflictError{Value: m.Name, Machine: other, Err: store.ErrNameTaken}
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		args := append([]any{m.ID, nullString(m.Name), m.Site, m.BootOverride}, bmcColumns(m.BMC)...)
		firmware := m.Firmware
		if firmware == "" {
			firmware = store.FirmwareBIOS
		}
		args = append(args, m.State, m.StateReason, ms(m.StateChangedAt), m.Approved, ms(m.CreatedAt), ms(m.UpdatedAt), firmware)
		_, err := tx.ExecContext(ctx, `INSERT INTO machines (id, name, site, boot_override, bmc_address, bmc_port, bmc_username,
			bmc_password, bmc_cipher_suite, state, state_reason, state_changed_at, approved, created_at, updated_at, firmware)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, args...)
		switch {
		case isForeignKey(err):
			return fmt.Errorf("site %q: %w", m.Site, store.ErrNotFound)
		case isConstraint(err):
			return fmt.Errorf("machine %s: %w", m.ID, store.ErrExists)
		case err != nil:
			return err
		}
		for _, mac := range m.MACs {
			var other string
			err := tx.QueryRowContext(ctx, `SELECT machine_id FROM machine_macs WHERE mac = ?`, mac).Scan(&other)
			if err == nil {
				return &store.ConflictError{Value: mac, Machine: other, Err: store.ErrMACTaken}
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO machine_macs (mac, machine_id) VALUES (?, ?)`, mac, m.ID); err != nil {
				if isConstraint(err) {
					return &store.ConflictError{Value: mac, Err: store.ErrMACTaken}
				}
				return err
			}
		}
		if err := bumpSpec(ctx, tx, m.Site, m.CreatedAt); err != nil {
			return err
		}
		return addMachineEvent(ctx, tx, store.MachineEvent{MachineID: m.ID, Time: m.CreatedAt, Kind: protocol.MachineEventAdded,
			Message: "added to site " + m.Site + " with " + strings.Join(m.MACs, ", ")})
	}))
}

func (s *sqliteStore) GetMachine(ctx context.Context, id string) (store.Machine, error) {
	m, err := scanMachine(s.r.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines WHERE id = ?`, id))
	return m, wrap("machine "+id, err)
}

func (s *sqliteStore) FindMachineByMAC(ctx context.Context, mac string) (store.Machine, error) {
	m, err := scanMachine(s.r.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines
		WHERE id = (SELECT machine_id FROM machine_macs WHERE mac = ?)`, mac))
	return m, wrap("machine with MAC "+mac, err)
}

func (s *sqliteStore) queryMachines(ctx context.Context, op, where string, args ...any) ([]store.Machine, error) {
	return queryAll(ctx, s.r, op, scanMachine, `SELECT `+machineColumns+` FROM machines `+where+` ORDER BY created_at, id`, args...)
}

func (s *sqliteStore) FindMachinesByName(ctx context.Context, name string) ([]store.Machine, error) {
	return s.queryMachines(ctx, "machines named "+name, `WHERE name = ?`, name)
}

func (s *sqliteStore) ListMachines(ctx context.Context, site string) ([]store.Machine, error) {
	if site == "" {
		return s.queryMachines(ctx, "list machines", "")
	}
	return s.queryMachines(ctx, "list machines of "+site, `WHERE site = ?`, site)
}

func (s *sqliteStore) CountMachinesByState(ctx context.Context) (map[string]int, error) {
	type count struct {
		state string
		n     int
	}
	rows, err := queryAll(ctx, s.r, "count machines by state", func(r interface{ Scan(...any) error }) (count, error) {
		var c count
		return c, r.Scan(&c.state, &c.n)
	}, `SELECT state, COUNT(*) FROM machines GROUP BY state`)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(rows))
	for _, c := range rows {
		out[c.state] = c.n
	}
	return out, nil
}

func (s *sqliteStore) UpdateMachine(ctx context.Context, id string, u store.MachineUpdate) (store.Machine, error) {
	var m store.Machine
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		if m, err = scanMachine(tx.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines WHERE id = ?`, id)); err != nil {
			return err
		}
		if u.IfIdle {
			if err := checkIdle(ctx, tx, m); err != nil {
				return err
			}
		}
		spec := false
		if u.BootOverride != nil && *u.BootOverride != m.BootOverride {
			if _, err := tx.ExecContext(ctx, `UPDATE machines SET boot_override = ? WHERE id = ?`, *u.BootOverride, id); err != nil {
				return err
			}
			spec = true
		}
		if u.Firmware != nil {
			if _, err := tx.ExecContext(ctx, `UPDATE machines SET firmware = ? WHERE id = ?`, *u.Firmware, id); err != nil {
				return err
			}
		}
		if u.SetBMC {
			args := append(bmcColumns(u.BMC), id)
			if _, err := tx.ExecContext(ctx, `UPDATE machines SET bmc_address = ?, bmc_port = ?, bmc_username = ?,
				bmc_password = ?, bmc_cipher_suite = ? WHERE id = ?`, args...); err != nil {
				return err
			}
			spec = true
		}
		if u.SetTPM {
			if err := setMachineTPM(ctx, tx, m, u.TPM, u.At); err != nil {
				return err
			}
		}
		if u.Approve {
			if _, err := tx.ExecContext(ctx, `UPDATE machines SET approved = 1 WHERE id = ?`, id); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE machines SET updated_at = ? WHERE id = ?`, ms(u.At), id); err != nil {
			return err
		}
		if spec {
			if err := bumpSpec(ctx, tx, m.Site, u.At); err != nil {
				return err
			}
		}
		if u.Event.Kind != "" {
			ev := u.Event
			ev.MachineID = id
			if ev.Time.IsZero() {
				ev.Time = u.At
			}
			if err := addMachineEvent(ctx, tx, ev); err != nil {
				return err
			}
		}
		m, err = scanMachine(tx.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines WHERE id = ?`, id))
		return err
	})
	return m, wrap("update machine "+id, err)
}

// checkIdle refuses (*BusyError) when m's deployment has not finished,
// within tx.
func checkIdle(ctx context.Context, tx *sql.Tx, m store.Machine) error {
	if m.Deployment == "" {
		return nil
	}
	var finished sql.NullInt64
	err := tx.QueryRowContext(ctx, `SELECT finished_at FROM deployments WHERE id = ?`, m.Deployment).Scan(&finished)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return err
	case !finished.Valid:
		return &store.BusyError{Machine: m.ID, State: m.State, Deployment: m.Deployment}
	}
	return nil
}

func (s *sqliteStore) DeleteMachine(ctx context.Context, id string, ifIdle bool) error {
	return wrap("delete machine "+id, s.tx(ctx, func(tx *sql.Tx) error {
		m, err := scanMachine(tx.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines WHERE id = ?`, id))
		if err != nil {
			return err
		}
		if ifIdle {
			if err := checkIdle(ctx, tx, m); err != nil {
				return err
			}
		}
		site := m.Site
		// A deployment's unused token goes with it: nobody may join as the
		// node of a machine that is gone.
		if _, err := tx.ExecContext(ctx, `UPDATE join_tokens SET revoked_at = ? WHERE machine_id = ? AND used_at IS NULL
			AND revoked_at IS NULL`, ms(time.Now()), id); err != nil {
			return err
		}
		for _, q := range []string{
			`DELETE FROM machine_macs WHERE machine_id = ?`,
			`DELETE FROM tpm_enrollments WHERE machine_id = ?`,
			`DELETE FROM machine_events WHERE machine_id = ?`,
			`DELETE FROM deployments WHERE machine_id = ?`,
			`DELETE FROM machines WHERE id = ?`,
		} {
			if _, err := tx.ExecContext(ctx, q, id); err != nil {
				return err
			}
		}
		return bumpSpec(ctx, tx, site, time.Now())
	}))
}

func (s *sqliteStore) AdoptBindings(ctx context.Context, id string, ch store.StatusChange) (store.Machine, error) {
	var m store.Machine
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if err := adoptBindings(ctx, tx, id, ch); err != nil {
			return err
		}
		var err error
		m, err = scanMachine(tx.QueryRowContext(ctx, `SELECT `+machineColumns+` FROM machines WHERE id = ?`, id))
		return err
	})
	return m, wrap("adopt bindings of machine "+id, err)
}

// adoptBindings writes the lifecycle's adoption of the bindings up to
// ch.BindSeq into the machine's status, within tx: ErrConflict when another
// binding came meanwhile.
func adoptBindings(ctx context.Context, tx *sql.Tx, id string, ch store.StatusChange) error {
	res, err := tx.ExecContext(ctx, `UPDATE machines SET ramdisk_node = ?, node = ?, bind_applied = ?, updated_at = ?
		WHERE id = ? AND bind_seq = ?`, ch.RamdiskNode, ch.Node, ch.BindSeq, ms(ch.At), id, ch.BindSeq)
	if err != nil {
		return err
	}
	if n, err := rowsAffected(res); err != nil || n == 1 {
		return err
	}
	var one int
	if err := tx.QueryRowContext(ctx, `SELECT 1 FROM machines WHERE id = ?`, id).Scan(&one); err != nil {
		return err
	}
	return store.ErrConflict
}

const (
	selectMachineByMAC = `SELECT m.id FROM machines m JOIN machine_macs a ON a.machine_id = m.id
		WHERE a.mac = ? AND m.site = ?`
	updateLastBoot = `UPDATE machines SET last_boot_stage = ?, last_boot_at = ?
		WHERE id = ? AND (last_boot_at IS NULL OR last_boot_at <= ?)`
)

func (s *sqliteStore) RecordBoots(ctx context.Context, site string, steps []store.BootStep) ([]string, error) {
	ids := make([]string, len(steps))
	if len(steps) == 0 {
		return ids, nil
	}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		sel, err := s.wstmt(ctx, tx, selectMachineByMAC)
		if err != nil {
			return err
		}
		for i, st := range steps {
			ids[i] = ""
			var id string
			switch err := sel.QueryRowContext(ctx, st.MAC, site).Scan(&id); {
			case errors.Is(err, sql.ErrNoRows):
				continue
			case err != nil:
				return err
			}
			if _, err := s.execw(ctx, tx, updateLastBoot, st.Stage, ms(st.Event.Time), id, ms(st.Event.Time)); err != nil {
				return err
			}
			ev := st.Event
			ev.MachineID = id
			if _, err := s.execw(ctx, tx, insertMachineEvent, machineEventArgs(ev)...); err != nil {
				return err
			}
			ids[i] = id
		}
		return nil
	})
	if err != nil {
		return nil, wrap("record boots", err)
	}
	return ids, nil
}

func (s *sqliteStore) RecordBoot(ctx context.Context, site, mac, stage string, ev store.MachineEvent) (string, error) {
	var id string
	err := s.tx(ctx, func(tx *sql.Tx) error {
		// Prepared once: a storm sends this for every machine and stage.
		sel, err := s.wstmt(ctx, tx, selectMachineByMAC)
		if err != nil {
			return err
		}
		if err := sel.QueryRowContext(ctx, mac, site).Scan(&id); err != nil {
			return err
		}
		// A late replay of an older step does not move the last boot back.
		if _, err := s.execw(ctx, tx, updateLastBoot, stage, ms(ev.Time), id, ms(ev.Time)); err != nil {
			return err
		}
		ev.MachineID = id
		_, err = s.execw(ctx, tx, insertMachineEvent, machineEventArgs(ev)...)
		return err
	})
	return id, wrap("record boot of "+mac, err)
}

const insertMachineEvent = `INSERT INTO machine_events (machine_id, time, kind, message, node_id, command_id, data)
	VALUES (?, ?, ?, ?, ?, ?, ?)`

func machineEventArgs(e store.MachineEvent) []any {
	return []any{e.MachineID, e.Time.UnixMilli(), e.Kind, e.Message, e.NodeID, e.CommandID, nullJSON(e.Data)}
}

func addMachineEvent(ctx context.Context, tx *sql.Tx, e store.MachineEvent) error {
	_, err := tx.ExecContext(ctx, insertMachineEvent, machineEventArgs(e)...)
	return err
}

func (s *sqliteStore) AddMachineEvent(ctx context.Context, e store.MachineEvent) error {
	return wrap("add machine event", s.tx(ctx, func(tx *sql.Tx) error { return addMachineEvent(ctx, tx, e) }))
}

func (s *sqliteStore) MachineEvents(ctx context.Context, machineID string, limit int) ([]store.MachineEvent, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.r.QueryContext(ctx, `SELECT id, machine_id, time, kind, message, node_id, command_id, data FROM (
		SELECT * FROM machine_events WHERE machine_id = ? ORDER BY id DESC LIMIT ?) ORDER BY id`, machineID, limit)
	if err != nil {
		return nil, wrap("machine events", err)
	}
	defer rows.Close()
	var out []store.MachineEvent
	for rows.Next() {
		var e store.MachineEvent
		var at int64
		var data sql.NullString
		if err := rows.Scan(&e.ID, &e.MachineID, &at, &e.Kind, &e.Message, &e.NodeID, &e.CommandID, &data); err != nil {
			return nil, wrap("machine events", err)
		}
		e.Time = time.UnixMilli(at).UTC()
		if data.Valid {
			e.Data = []byte(data.String)
		}
		out = append(out, e)
	}
	return out, wrap("machine events", rows.Err())
}

// nonceKeep is how long an expired nonce is kept, for a join that presents
// it late to be told it expired rather than that it is unknown.
const nonceKeep = 24 * time.Hour

const nonceColumns = `hash, mac, site, site_node, machine_id, created_at, expires_at, csr_sha256, deferred_at, used_at, used_by`

func scanNonce(sc interface{ Scan(...any) error }) (store.BootNonce, error) {
	var n store.BootNonce
	var hash []byte
	var created, expires, deferred, used sql.NullInt64
	if err := sc.Scan(&hash, &n.MAC, &n.Site, &n.SiteNode, &n.MachineID, &created, &expires, &n.CSRSHA256, &deferred,
		&used, &n.UsedBy); err != nil {
		return store.BootNonce{}, err
	}
	if len(hash) != len(n.Hash) {
		return store.BootNonce{}, fmt.Errorf("boot nonce hash is %d bytes, want %d", len(hash), len(n.Hash))
	}
	copy(n.Hash[:], hash)
	n.CreatedAt, n.ExpiresAt, n.DeferredAt, n.UsedAt = fromMS(created), fromMS(expires), fromMS(deferred), fromMS(used)
	return n, nil
}

const (
	deleteExpiredNonces = `DELETE FROM boot_nonces WHERE expires_at < ?`
	insertBootNonce     = `INSERT INTO boot_nonces (hash, mac, site, site_node, machine_id, created_at, expires_at)
	VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (hash) DO NOTHING`
)

// addNonce inserts n, and its Event when n was new, within tx; it reports
// whether n was new.
func (s *sqliteStore) addNonce(ctx context.Context, tx *sql.Tx, n store.BootNonce) (bool, error) {
	res, err := s.execw(ctx, tx, insertBootNonce, n.Hash[:], n.MAC, n.Site, n.SiteNode, n.MachineID, ms(n.CreatedAt), ms(n.ExpiresAt))
	if err != nil {
		return false, err
	}
	k, err := rowsAffected(res)
	if err != nil || k != 1 || n.Event == nil {
		return k == 1, err
	}
	_, err = s.execw(ctx, tx, insertMachineEvent, machineEventArgs(*n.Event)...)
	return true, err
}

func (s *sqliteStore) AddBootNonce(ctx context.Context, n store.BootNonce) (bool, error) {
	added := false
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := s.execw(ctx, tx, deleteExpiredNonces, n.CreatedAt.Add(-nonceKeep).UnixMilli()); err != nil {
			return err
		}
		var err error
		added, err = s.addNonce(ctx, tx, n)
		return err
	})
	return added, wrap("add boot nonce", err)
}

// AddBootNonces is a round of a site agent's nonces in one transaction, with the
// write connection's prepared statements: a flood of script GETs costs serve a
// commit per round, not one per nonce, and the expired nonces' DELETE runs once.
func (s *sqliteStore) AddBootNonces(ctx context.Context, site string, ns []store.BootNonce) ([]bool, error) {
	added := make([]bool, len(ns))
	if len(ns) == 0 {
		return added, nil
	}
	var latest time.Time
	for _, n := range ns {
		if n.CreatedAt.After(latest) {
			latest = n.CreatedAt
		}
	}
	err := s.tx(ctx, func(tx *sql.Tx) error {
		if _, err := s.execw(ctx, tx, deleteExpiredNonces, latest.Add(-nonceKeep).UnixMilli()); err != nil {
			return err
		}
		sel, err := s.wstmt(ctx, tx, selectMachineByMAC)
		if err != nil {
			return err
		}
		for i, n := range ns {
			n.Site, n.MachineID = site, ""
			switch err := sel.QueryRowContext(ctx, n.MAC, site).Scan(&n.MachineID); {
			case errors.Is(err, sql.ErrNoRows):
				n.Event = nil
			case err != nil:
				return err
			case n.Event != nil:
				ev := *n.Event
				ev.MachineID = n.MachineID
				n.Event = &ev
			}
			if added[i], err = s.addNonce(ctx, tx, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, wrap("add boot nonces", err)
	}
	return added, nil
}

func (s *sqliteStore) GetBootNonce(ctx context.Context, h token.Hash) (store.BootNonce, error) {
	n, err := scanNonce(s.r.QueryRowContext(ctx, `SELECT `+nonceColumns+` FROM boot_nonces WHERE hash = ?`, h[:]))
	return n, wrap("boot nonce", err)
}

func (s *sqliteStore) DeferBootNonce(ctx context.Context, h token.Hash, csrSHA256 string, at time.Time) (bool, error) {
	first := false
	err := s.tx(ctx, func(tx *sql.Tx) error {
		n, err := scanNonce(tx.QueryRowContext(ctx, `SELECT `+nonceColumns+` FROM boot_nonces WHERE hash = ?`, h[:]))
		switch {
		case err != nil:
			return err
		case !n.UsedAt.IsZero():
			return store.ErrNonceUsed
		case n.CSRSHA256 == csrSHA256:
			return nil
		case n.CSRSHA256 != "":
			return store.ErrNonceClaimed
		}
		first = true
		_, err = tx.ExecContext(ctx, `UPDATE boot_nonces SET csr_sha256 = ?, deferred_at = ? WHERE hash = ?`, csrSHA256, ms(at), h[:])
		return err
	})
	return first, wrap("defer boot nonce", err)
}

// consumeNonce marks a nonce used by nodeID, within tx.
func consumeNonce(ctx context.Context, tx *sql.Tx, h token.Hash, nodeID string, now time.Time) error {
	res, err := tx.ExecContext(ctx, `UPDATE boot_nonces SET used_at = ?, used_by = ? WHERE hash = ? AND used_at IS NULL`,
		ms(now), nodeID, h[:])
	if err != nil {
		return err
	}
	if n, err := rowsAffected(res); err != nil || n == 1 {
		return err
	}
	var one int
	if err := tx.QueryRowContext(ctx, `SELECT 1 FROM boot_nonces WHERE hash = ?`, h[:]).Scan(&one); err != nil {
		return err
	}
	return store.ErrNonceUsed
}

// bindMachine records a joined node's binding to its machine, within tx: an
// observation (bound_ramdisk, bound_node, bind_seq) the lifecycle adopts
// into the machine's status, never the status itself. A ramdisk node
// becomes the machine's bound ramdisk (its claims the inventory); a machine
// that is gone refuses it (ErrNoMachine). An installed OS's node becomes
// the machine's bound node and retires the ramdisk that installed it; a
// machine deleted meanwhile does not stop that join.
func bindMachine(ctx context.Context, tx *sql.Tx, a store.Admission) error {
	n := a.Node
	var ramdisk, installed string
	err := tx.QueryRowContext(ctx, `SELECT bound_ramdisk, bound_node FROM machines WHERE id = ?`, a.Machine).Scan(&ramdisk, &installed)
	switch {
	case errors.Is(err, sql.ErrNoRows) && n.Role == protocol.RoleRamdisk:
		return fmt.Errorf("machine %s: %w", a.Machine, store.ErrNoMachine)
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	what := "ramdisk"
	if n.Role == protocol.RoleRamdisk {
		set, args := `bound_ramdisk = ?, bind_seq = bind_seq + 1`, []any{n.ID}
		if len(a.Inventory) > 0 {
			set += `, inventory = ?, inventory_at = ?`
			args = append(args, string(a.Inventory), ms(a.Now))
		}
		if _, err := tx.ExecContext(ctx, `UPDATE machines SET `+set+`, updated_at = ? WHERE id = ?`, append(args, ms(a.Now), a.Machine)...); err != nil {
			return err
		}
	} else {
		what = "installed OS"
		if _, err := tx.ExecContext(ctx, `UPDATE machines SET bound_node = ?, bound_ramdisk = '', bind_seq = bind_seq + 1,
			updated_at = ? WHERE id = ?`,
			n.ID, ms(a.Now), a.Machine); err != nil {
			return err
		}
		// The ramdisk that wrote the OS is gone once the OS runs, and so is
		// the OS an earlier deployment installed: its disk was overwritten.
		for _, old := range []string{ramdisk, installed} {
			if old == "" || old == n.ID {
				continue
			}
			if err := deleteNode(ctx, tx, old, a.Now, "the machine's installed OS joined"); err != nil &&
				!errors.Is(err, store.ErrNodeDeleted) && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
	}
	msg := "the " + what + " joined as node " + n.ID
	if n.ProvenEKSHA256 != "" {
		msg += ", proving TPM endorsement key " + n.ProvenEKSHA256
	}
	return addMachineEvent(ctx, tx, store.MachineEvent{MachineID: a.Machine, Time: a.Now, Kind: protocol.MachineEventJoin,
		Message: msg, NodeID: n.ID})
}
