package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/bcd/protocol"
)

// FleetEvent is one entry of a machine's timeline (machines events -o json).
type FleetEvent struct {
	Time    time.Time       `json:"time"`
	Kind    string          `json:"kind"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data"`
}

// BootStage is what a machine.booted event's data says: the stage the site agent
// served and when it served it (the site's clock, not the time the control plane
// stored the event, which is later when the site was cut off).
type BootStage struct {
	MAC   string    `json:"mac"`
	Stage string    `json:"stage"`
	File  string    `json:"file"`
	Time  time.Time `json:"time"`
}

// Events reads a machine's timeline as an operator does.
func (f *Fleet) Events(m *FleetMachine) ([]FleetEvent, error) {
	out, err := f.BC("machines", "events", m.Name, "-o", "json")
	if err != nil {
		return nil, err
	}
	var v struct {
		Events []FleetEvent `json:"events"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return nil, fmt.Errorf("machines events -o json: %w", err)
	}
	return v.Events, nil
}

// BootStages are the machine.booted events of a machine's timeline served at or
// after since, by the site's clock.
func (f *Fleet) BootStages(m *FleetMachine, since time.Time) ([]BootStage, error) {
	evs, err := f.Events(m)
	if err != nil {
		return nil, err
	}
	var out []BootStage
	for _, e := range evs {
		if e.Kind != protocol.EventMachineBooted {
			continue
		}
		var b BootStage
		if json.Unmarshal(e.Data, &b) == nil && !b.Time.Before(since) {
			out = append(out, b)
		}
	}
	return out, nil
}

// PluginPIDs are the running bcx-ipmi plugin processes the site agent started
// (its descendants through the sandbox launcher), found in /proc.
func (f *Fleet) PluginPIDs() []int {
	if f.siteAgent == nil {
		return nil
	}
	root := f.siteAgent.PID()
	parents := map[int]int{}
	var plugins []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// comm may hold spaces; the fields after its closing parenthesis do not.
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 || fields[0] == "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		parents[pid] = ppid
		if comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); strings.TrimSpace(string(comm)) == "bcx-ipmi" {
			plugins = append(plugins, pid)
		}
	}
	var mine []int
	for _, pid := range plugins {
		for p, hops := parents[pid], 0; p > 1 && hops < 16; p, hops = parents[p], hops+1 {
			if p == root {
				mine = append(mine, pid)
				break
			}
		}
	}
	return mine
}

// waitNodeSession waits until the machine's node id has an open session other
// than session (the one it had before a reboot; 0 when it had none).
func (f *Fleet) waitNodeSession(ctx context.Context, m *FleetMachine, id string, session int64, timeout time.Duration) error {
	if id == "" {
		return fmt.Errorf("machine %s has no node", m.Name)
	}
	return waitFor(ctx, timeout, func() bool {
		n, s := f.node(m)
		return n == id && s != 0 && s != session
	})
}

// waitNewQEMU waits until the machine's BMC has started a QEMU other than pid.
func waitNewQEMU(ctx context.Context, m *FleetMachine, pid int, timeout time.Duration) error {
	return waitFor(ctx, timeout, func() bool {
		p, ok := m.BMC.QEMUPID()
		return ok && p != pid
	})
}
