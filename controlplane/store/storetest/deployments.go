package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/protocol"
)

func newDeployment(machine string, now time.Time) store.Deployment {
	return store.Deployment{ID: ids.New(ids.PrefixDeployment, now), MachineID: machine, Step: "bootdev",
		Spec: store.DeploySpec{Image: protocol.DeployImage{URL: "https://x.test/os.raw", SHA256: strings.Repeat("a", 64), Size: 1}, After: "kexec", Pool: "default"}}
}

func testDeployments(t *testing.T, s store.Store) {
	s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: time.Now()})
	m := newMachine("m_1", "fsn1", "52:54:00:00:00:01")
	m.Firmware = store.FirmwareUEFI
	if err := s.CreateMachine(ctx, m); err != nil {
		t.Fatal(err)
	}
	site0, _ := s.GetSite(ctx, "fsn1")
	now := time.Now().Truncate(time.Millisecond)
	mode := protocol.BootRamdisk
	d, err := s.StartDeployment(ctx, newDeployment(m.ID, now), store.DeploymentChange{State: store.MachinePXEBooting, Reason: "deploying", BootMode: &mode, At: now})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetMachine(ctx, m.ID)
	site1, _ := s.GetSite(ctx, "fsn1")
	if got.State != store.MachinePXEBooting || got.StateReason != "deploying" || got.Deployment != d.ID || got.BootMode != protocol.BootRamdisk ||
		got.Firmware != store.FirmwareUEFI || site1.SpecRevision != site0.SpecRevision+1 || d.Version != 1 {
		t.Errorf("after start: %+v (spec %d → %d) %+v", got, site0.SpecRevision, site1.SpecRevision, d)
	}
	if _, err := s.StartDeployment(ctx, newDeployment(m.ID, now), store.DeploymentChange{State: store.MachinePXEBooting, At: now}); !errors.Is(err, store.ErrDeploymentActive) {
		t.Errorf("a second deployment: %v", err)
	}
	if _, err := s.StartDeployment(ctx, newDeployment("m_gone", now), store.DeploymentChange{At: now}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a deployment of no machine: %v", err)
	}

	// A step: a token and a command with the deployment, in one go.
	j := token.NewJoin(now)
	tok := store.Token{ID: j.ID, Hash: j.Hash, Pool: "default", Site: "fsn1", Role: "node", NodeID: "n_os", MachineID: m.ID, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	cmd := store.Command{ID: ids.New(ids.PrefixCommand, now), NodeID: "n_rd", MachineID: m.ID, Kind: protocol.KindDeployImage, State: store.CommandPending,
		CreatedAt: now, UpdatedAt: now}
	next := d
	next.Step, next.CommandID, next.TokenID, next.NodeID, next.DeployAttempts = "deploy", cmd.ID, tok.ID, "n_os", 1
	next.Deadline = now.Add(time.Minute)
	next, err = s.AdvanceDeployment(ctx, next, store.DeploymentChange{State: store.MachineDeploying, Reason: "deploy.image", Tokens: []store.Token{tok},
		Commands: []store.Command{cmd}, Events: []store.MachineEvent{{Kind: protocol.MachineEventNote, Message: "note"}}, At: now})
	if err != nil {
		t.Fatal(err)
	}
	if next.Version != 2 {
		t.Errorf("version %d", next.Version)
	}
	if _, err := s.GetToken(ctx, tok.ID); err != nil {
		t.Errorf("token: %v", err)
	}
	if c, err := s.GetCommand(ctx, cmd.ID); err != nil || c.MachineID != m.ID {
		t.Errorf("command %+v %v", c, err)
	}
	stored, err := s.GetDeployment(ctx, d.ID)
	if err != nil || stored.Step != "deploy" || !stored.Deadline.Equal(now.Add(time.Minute)) || stored.TokenID != tok.ID || stored.Version != 2 ||
		stored.Spec.Pool != "default" || stored.Finished() {
		t.Errorf("stored %+v %v", stored, err)
	}
	// A write of the version before is refused.
	if _, err := s.AdvanceDeployment(ctx, d, store.DeploymentChange{State: store.MachineFailed, At: now}); !errors.Is(err, store.ErrConflict) {
		t.Errorf("stale write: %v", err)
	}
	evs, _ := s.MachineEvents(ctx, m.ID, 0)
	var k []string
	for _, e := range evs {
		k = append(k, e.Kind)
	}
	if strings.Join(k, ",") != "machine.added,state,state,lifecycle,command" {
		t.Errorf("timeline %v", k)
	}
	if evs[2].Message != "deploying: deploy.image" || !strings.Contains(string(evs[2].Data), `"from":"pxe-booting","to":"deploying"`) {
		t.Errorf("state event %+v %s", evs[2], evs[2].Data)
	}
	if ds, _ := s.OpenDeployments(ctx); len(ds) != 1 || ds[0].ID != d.ID {
		t.Errorf("open %+v", ds)
	}

	// Finished: the token revoked, and another deployment may start.
	fin, err := s.AdvanceDeployment(ctx, next, store.DeploymentChange{State: store.MachineFailed, Reason: "x", RevokeTokens: []string{tok.ID}, Finish: "failed", At: now})
	if err != nil || !fin.Finished() || fin.Outcome != "failed" {
		t.Fatalf("finish %+v %v", fin, err)
	}
	if tk, _ := s.GetToken(ctx, tok.ID); tk.RevokedAt.IsZero() {
		t.Error("the token was not revoked")
	}
	if ds, _ := s.OpenDeployments(ctx); len(ds) != 0 {
		t.Errorf("open after finish %+v", ds)
	}
	if _, err := s.StartDeployment(ctx, newDeployment(m.ID, now), store.DeploymentChange{State: store.MachinePXEBooting, At: now}); err != nil {
		t.Errorf("a deployment after the first ended: %v", err)
	}
	if ms, err := s.ListMachinesInState(ctx, store.MachinePXEBooting); err != nil || len(ms) != 1 {
		t.Errorf("in state: %v %v", ms, err)
	}

	// Deleting the machine takes its deployments along.
	if err := s.DeleteMachine(ctx, m.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetDeployment(ctx, d.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("deployment of a deleted machine: %v", err)
	}
}

func testFindMachineByNodeAndRetire(t *testing.T, s store.Store) {
	s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: time.Now()})
	s.CreateMachine(ctx, newMachine("m_1", "fsn1", "52:54:00:00:00:01"))
	admit := func(id, role string) {
		t.Helper()
		if err := s.Admit(ctx, store.Admission{Node: store.Node{ID: id, Role: role, Site: "fsn1", SPIFFEID: "x", CertSerial: id, CertNotAfter: time.Now().Add(time.Hour),
			State: "adopting"}, Machine: "m_1", Now: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	admit("n_rd1", "ramdisk")
	if m, err := s.FindMachineByNode(ctx, "n_rd1"); err != nil || m.ID != "m_1" {
		t.Errorf("by ramdisk: %+v %v", m, err)
	}
	admit("n_os1", "node")
	if m, err := s.FindMachineByNode(ctx, "n_os1"); err != nil || m.ID != "m_1" || m.BoundRamdisk != "" || m.BoundNode != "n_os1" || !m.PendingBindings() || m.Node != "" {
		t.Errorf("by node: %+v %v", m, err)
	}
	// A second deployment: its OS retires the first's.
	admit("n_rd2", "ramdisk")
	admit("n_os2", "node")
	if n, _ := s.GetNode(ctx, "n_os1"); !n.Deleted() {
		t.Error("the earlier installed OS's node was not retired")
	}
	if n, _ := s.GetNode(ctx, "n_os2"); n.Deleted() {
		t.Error("the new node was retired")
	}
	if _, err := s.FindMachineByNode(ctx, "n_none"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown node: %v", err)
	}
	if se, err := s.GetSession(ctx, 99); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown session: %+v %v", se, err)
	}
	id, _ := s.OpenSession(ctx, store.Session{NodeID: "n_os2", Role: "node", BootID: "b1", ConnectedAt: time.Now()})
	if se, err := s.GetSession(ctx, id); err != nil || se.BootID != "b1" || se.NodeID != "n_os2" {
		t.Errorf("session %+v %v", se, err)
	}
}
