package api

import (
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// Store rows with every field set (full) and with none (zero): the golden
// files in testdata are what the api answers for them, so that a change to
// the api's JSON (a field renamed, reordered, or omitempty lost) is seen.
var (
	t1 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	t2 = t1.Add(time.Minute)
	t3 = t1.Add(2 * time.Minute)
)

func fullSite() store.Site {
	return store.Site{Name: "fsn1", Approval: store.ApprovalManual,
		HTTPProxy:    &protocol.HTTPProxySection{Listen: "10.20.0.2:3128", Allow: []string{"deb.debian.org:443"}},
		SpecRevision: 7, CreatedAt: t1, UpdatedAt: t2}
}

func fullToken() store.Token {
	return store.Token{ID: "tok_1", Hash: [32]byte{1}, Pool: "p", Site: "fsn1", Role: protocol.RoleNode, NodeID: "n_1",
		MachineID: "m_1", AllowReclaim: true, CreatedAt: t1, ExpiresAt: t3, UsedAt: t2, UsedBy: "n_1", RevokedAt: t2}
}

// usedToken is fullToken before it was revoked.
func usedToken() store.Token {
	t := fullToken()
	t.RevokedAt = time.Time{}
	return t
}

func fullNode() store.Node {
	return store.Node{ID: "n_1", Role: protocol.RoleNode, Site: "fsn1", Pool: "p", SPIFFEID: "spiffe://x/node/n_1",
		Claims: json.RawMessage(`{"system_uuid":"u"}`), SystemUUID: "u", TPMEKSHA256: "ab", TPMEKProven: true, CertSerial: "1f",
		CertNotAfter: t3, State: "ready", Cordoned: true, CreatedAt: t1, UpdatedAt: t2, JoinedAt: t1, DeletedAt: t3,
		SessionID: 4, DaemonVersion: "v1", LastSeenAt: t2, SpecRevision: 3}
}

func fullCommand() store.Command {
	content := base64.StdEncoding.EncodeToString([]byte("bcjt_secret"))
	return store.Command{ID: "cmd_1", NodeID: "n_1", MachineID: "m_1", Kind: protocol.KindDeployImage,
		Params: json.RawMessage(`{"files":[{"path":"/etc/bcd/join-token","mode":"0600","uid":0,"gid":0,"content":"` + content + `"}]}`),
		State:  protocol.StateSucceeded, Reason: "R", Message: "m", Progress: json.RawMessage(`{"bytes":1}`),
		Result: json.RawMessage(`{"ok":true}`), CreatedAt: t1, UpdatedAt: t2, SentAt: t2}
}

func fullMachine() store.Machine {
	return store.Machine{ID: "m_1", Site: "fsn1",
		MachineSpec: store.MachineSpec{Name: "web1", MACs: []string{"52:54:00:00:00:01", "52:54:00:00:00:02"},
			BMC:      &store.MachineBMC{Address: "10.0.0.9", Port: 6230, Username: "admin", Password: "hunter2", CipherSuite: 17},
			Firmware: store.FirmwareUEFI, Approved: true},
		MachineStatus: store.MachineStatus{BootMode: protocol.BootRamdisk, State: store.MachineFailed, StateReason: "why",
			StateChangedAt: t2, RamdiskNode: "n_r", Node: "n_1", Deployment: "dep_1"},
		MachineObserved: store.MachineObserved{Inventory: json.RawMessage(`{"cpus":4}`), InventoryAt: t2, LastBootStage: "ipxe",
			LastBootAt: t2},
		CreatedAt: t1, UpdatedAt: t3}
}

func fullDeployment() store.Deployment {
	return store.Deployment{ID: "dep_1", MachineID: "m_1", Spec: store.DeploySpec{
		Image: protocol.DeployImage{URL: "https://user:pw@images.example/os.raw.gz?sig=s#f", SHA256: "aa", Size: 10,
			Format: "raw.gz", ImageSize: 20},
		Target: protocol.DeployTarget{Serial: "S1", Path: "/dev/sda"}, After: protocol.AfterReboot, Cmdline: "console=ttyS0",
		Pool: "p"}, Step: "boot", Deadline: t3, BootAttempts: 1, DeployAttempts: 2, DeployFailures: 1, BMCAttempts: 3,
		CommandID: "cmd_1", RamdiskNode: "n_r", NodeID: "n_1", TokenID: "tok_1", LostAt: t2, NodeSession: 5,
		NodeBootID: "b", Outcome: "failed", FinishedAt: t3, Version: 9, CreatedAt: t1, UpdatedAt: t2}
}

func fullEvent() store.MachineEvent {
	return store.MachineEvent{ID: 1, MachineID: "m_1", Time: t1, Kind: protocol.MachineEventState, Message: "m",
		NodeID: "n_1", CommandID: "cmd_1", Data: json.RawMessage(`{"from":"a","to":"b"}`)}
}

func fullImage() store.Image {
	return store.Image{Name: "debian-12", Image: protocol.DeployImage{URL: "https://user:pw@images.example/os.raw.gz?sig=s#f",
		SHA256: "aa", Size: 10, Format: "raw.gz", ImageSize: 20}, CreatedAt: t1}
}
