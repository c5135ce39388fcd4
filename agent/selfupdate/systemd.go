package selfupdate

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/pki"
)

// The crash-loop guard (spec step 4): bcd.service gets a drop-in that starts
// bcd-rollback.service when it hits its start limit, and that unit runs the
// previous slot's `bcd update --rollback`, which restores previous only while
// upgrade.json exists.
const (
	RollbackUnitName = "bcd-rollback.service"
	DropInDir        = "bcd.service.d"
	DropInName       = "50-bcd-rollback.conf"

	// DropInText is 50-bcd-rollback.conf: five failed starts within ten
	// minutes make bcd.service fail for good, and its failure starts the
	// rollback.
	DropInText = `# Written by bcd's self-update: a crash-looping bcd rolls back an unconfirmed update.
[Unit]
StartLimitIntervalSec=600
StartLimitBurst=5
OnFailure=bcd-rollback.service
`

	// RollbackUnitFormat is bcd-rollback.service with the slots directory
	// and the config path to fill in (RollbackUnitText). The restart of
	// bcd.service is in the unit, not in bcd: ExecStartPost runs only when
	// `bcd update --rollback` exited 0, so bcd update --rollback must exit
	// non-zero when there was nothing to roll back (a confirmed release
	// crash-looping), and bcd.service then stays failed for an operator
	// instead of looping through the rollback unit every ten minutes.
	// reset-failed clears the start limit that triggered the rollback;
	// --no-block because this oneshot would otherwise wait on bcd.service,
	// whose OnFailure it is.
	RollbackUnitFormat = `# Written by bcd's self-update.
[Unit]
Description=Roll bcd back to its previous slot after an unconfirmed update crash-looped
Documentation=https://github.com/better-compute/better-compute

[Service]
Type=oneshot
ExecStart=%s update --rollback --config %s
ExecStartPost=/bin/systemctl reset-failed bcd.service
ExecStartPost=/bin/systemctl --no-block start bcd.service
`
)

// RollbackUnitText is bcd-rollback.service for a slots directory and config.
func RollbackUnitText(slotsDir, configPath string) string {
	return fmt.Sprintf(RollbackUnitFormat, filepath.Join(slotsDir, PreviousLink), configPath)
}

// RollbackUnitPath and DropInPath are where the two files go under unitDir.
func RollbackUnitPath(unitDir string) string { return filepath.Join(unitDir, RollbackUnitName) }

// DropInPath is bcd.service.d/50-bcd-rollback.conf under unitDir.
func DropInPath(unitDir string) string { return filepath.Join(unitDir, DropInDir, DropInName) }

// writeRollbackUnit writes the unit and drop-in where they are absent or
// differ, and runs systemctl daemon-reload when it wrote one.
func (m *Manager) writeRollbackUnit(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Join(m.o.UnitDir, DropInDir), 0o755); err != nil {
		return fmt.Errorf("selfupdate: %w", err)
	}
	changed := false
	for _, f := range []struct{ path, text string }{
		{RollbackUnitPath(m.o.UnitDir), RollbackUnitText(m.o.SlotsDir, m.o.ConfigPath)},
		{DropInPath(m.o.UnitDir), DropInText},
	} {
		old, err := secretfile.Read(f.path, secretfile.Options{Limit: maxRecordSize, NoFollow: true})
		if err == nil && bytes.Equal(old, []byte(f.text)) {
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("self-update: replacing an unreadable unit file", "path", f.path, "err", err)
		}
		if err := pki.WriteFileAtomic(f.path, []byte(f.text), 0o644); err != nil {
			return fmt.Errorf("selfupdate: %w", err)
		}
		changed = true
	}
	if !changed {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "systemctl", "daemon-reload").CombinedOutput()
	if err != nil {
		return fmt.Errorf("selfupdate: systemctl daemon-reload: %w: %s", err, bytes.TrimSpace(out))
	}
	m.log.Info("self-update: wrote the crash-loop rollback unit", "unit", RollbackUnitPath(m.o.UnitDir), "drop-in", DropInPath(m.o.UnitDir))
	return nil
}
