package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// testBusyMachineRefusesSpecChanges: with IfIdle, a spec change and a
// delete of a machine whose deployment runs are refused in the store's
// transaction with a *BusyError naming the deployment; approval, asked
// without IfIdle, goes through; once the deployment ends, the change does.
func testBusyMachineRefusesSpecChanges(t *testing.T, s store.Store) {
	now := time.Now()
	s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: now})
	m := newMachine("m_1", "fsn1", "52:54:00:00:00:01")
	m.BootOverride = protocol.BootLocal
	if err := s.CreateMachine(ctx, m); err != nil {
		t.Fatal(err)
	}
	mode := protocol.BootRamdisk
	d, err := s.StartDeployment(ctx, newDeployment(m.ID, now), store.DeploymentChange{State: store.MachinePXEBooting, BootMode: &mode, At: now})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.GetMachine(ctx, m.ID)
	if err != nil || got.BootOverride != "" || got.BootMode != protocol.BootRamdisk || got.EffectiveBootMode() != protocol.BootRamdisk {
		t.Errorf("a deploy hands the boot mode to the lifecycle: override %q status %q effective %q (%v)", got.BootOverride, got.BootMode,
			got.EffectiveBootMode(), err)
	}
	uefi := store.FirmwareUEFI
	_, err = s.UpdateMachine(ctx, m.ID, store.MachineUpdate{Firmware: &uefi, IfIdle: true, At: now})
	var busy *store.BusyError
	if !errors.As(err, &busy) || !errors.Is(err, store.ErrMachineBusy) || busy.Deployment != d.ID || busy.Machine != m.ID {
		t.Fatalf("firmware change of a busy machine: %v", err)
	}
	if err := s.DeleteMachine(ctx, m.ID, true); !errors.As(err, &busy) || busy.Deployment != d.ID {
		t.Errorf("delete of a busy machine: %v", err)
	}
	if _, err := s.GetMachine(ctx, m.ID); err != nil {
		t.Errorf("the refused delete removed the machine: %v", err)
	}
	if got, err := s.UpdateMachine(ctx, m.ID, store.MachineUpdate{Approve: true, At: now}); err != nil || !got.Approved {
		t.Errorf("approval during the deployment: %+v %v", got.MachineSpec, err)
	}
	if _, err := s.AdvanceDeployment(ctx, d, store.DeploymentChange{State: store.MachineFailed, Finish: "cancelled", At: now}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.UpdateMachine(ctx, m.ID, store.MachineUpdate{Firmware: &uefi, IfIdle: true, At: now}); err != nil || got.Firmware != uefi {
		t.Errorf("firmware change once the deployment ended: %+v %v", got.MachineSpec, err)
	}
	if err := s.DeleteMachine(ctx, m.ID, true); err != nil {
		t.Errorf("delete once the deployment ended: %v", err)
	}
}

// testBindingsAreObservations: a join records its binding in the machine's
// observed part and leaves the status alone; the lifecycle adopts it under a
// BindSeq check, and a binding that arrives in between makes the adoption a
// conflict.
func testBindingsAreObservations(t *testing.T, s store.Store) {
	now := time.Now()
	s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: now})
	s.CreateMachine(ctx, newMachine("m_1", "fsn1", "52:54:00:00:00:01"))
	admit := func(id, role string) {
		t.Helper()
		if err := s.Admit(ctx, store.Admission{Node: store.Node{ID: id, Role: role, Site: "fsn1", SPIFFEID: "x", CertSerial: id,
			CertNotAfter: now.Add(time.Hour), State: "adopting"}, Machine: "m_1", Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	admit("n_rd1", protocol.RoleRamdisk)
	m, err := s.GetMachine(ctx, "m_1")
	if err != nil || m.BoundRamdisk != "n_rd1" || m.RamdiskNode != "" || !m.PendingBindings() {
		t.Fatalf("after the ramdisk's join: bound %q status %q pending %v (%v)", m.BoundRamdisk, m.RamdiskNode, m.PendingBindings(), err)
	}
	if ms, err := s.ListMachinesWithPendingBindings(ctx); err != nil || len(ms) != 1 || ms[0].ID != "m_1" {
		t.Errorf("machines with pending bindings: %d %v", len(ms), err)
	}
	seen := m.BindSeq
	admit("n_os1", protocol.RoleNode)
	// The adoption of what the lifecycle read before the second join.
	if _, err := s.AdoptBindings(ctx, "m_1", store.StatusChange{BindSeq: seen, RamdiskNode: "n_rd1", At: now}); !errors.Is(err, store.ErrConflict) {
		t.Errorf("a stale adoption: %v", err)
	}
	m, _ = s.GetMachine(ctx, "m_1")
	got, err := s.AdoptBindings(ctx, "m_1", store.StatusChange{BindSeq: m.BindSeq, RamdiskNode: m.BoundRamdisk, Node: m.BoundNode, At: now})
	if err != nil || got.Node != "n_os1" || got.RamdiskNode != "" || got.PendingBindings() {
		t.Errorf("adopted: node %q ramdisk %q pending %v (%v)", got.Node, got.RamdiskNode, got.PendingBindings(), err)
	}
	if ms, err := s.ListMachinesWithPendingBindings(ctx); err != nil || len(ms) != 0 {
		t.Errorf("machines with pending bindings after the adoption: %d %v", len(ms), err)
	}
	if _, err := s.AdoptBindings(ctx, "m_nope", store.StatusChange{At: now}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("adoption for a missing machine: %v", err)
	}
}
