package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// TestConvertGolden: what the api answers for the fixtures' rows is, byte
// for byte, what it answered when its types embedded the store's rows (the
// golden files were written then), so the CLI's output and the demo's
// timeline stay the same. UPDATE_TESTDATA=1 rewrites them.
func TestConvertGolden(t *testing.T) {
	fd := fullDeployment()
	cur := toDeployment(fd)
	full := toMachine(fullMachine(), store.ApprovalManual, true, true)
	withDep := full
	withDep.CurrentDeployment = &cur
	zero := toMachine(store.Machine{}, "", false, false)
	cases := map[string]any{
		"site_full":           toSite(fullSite()),
		"site_zero":           toSite(store.Site{}),
		"sites_zero":          apitype.SiteList{Sites: toSites(nil)},
		"token_full":          toToken(fullToken(), t1),
		"token_zero":          toToken(store.Token{ExpiresAt: t1}, t1.Add(-1)),
		"token_created":       apitype.TokenCreated{TokenInfo: toToken(usedToken(), t1), Token: "bcjt_x"},
		"tokens_zero":         apitype.TokenList{Tokens: []apitype.TokenInfo{}},
		"node_full":           toNode(fullNode(), nil),
		"node_zero":           toNode(store.Node{}, nil),
		"nodes_zero":          apitype.NodeList{Nodes: []apitype.NodeInfo{}},
		"command_full":        toCommand(fullCommand()),
		"command_zero":        toCommand(store.Command{}),
		"machine_full":        withDep,
		"machine_zero":        zero,
		"machines_full":       apitype.MachineList{Machines: []apitype.MachineInfo{full}},
		"events_full":         apitype.MachineEventList{Machine: "m_1", Events: toEvents([]store.MachineEvent{fullEvent(), {}})},
		"events_zero":         apitype.MachineEventList{Events: toEvents(nil)},
		"deploy_created":      apitype.DeployCreated{Machine: full, Deployment: cur},
		"deploy_created_zero": apitype.DeployCreated{Machine: zero, Deployment: toDeployment(store.Deployment{})},
		"node_upgrading":      toNode(upgradingNode(), &store.SectionStatus{State: "FAILED", Reason: "UpdateFailed", Message: "bcd 0.1.2 did not start", Version: "0.1.2", Revision: 4}),
		"release_full":        toRelease(fullRelease()),
		"releases_zero":       apitype.ReleaseList{Releases: []apitype.Release{}},
		"rollout_full":        toRollout(fullRollout()),
		"rollout_zero":        toRollout(store.Rollout{}),
		"image_full":          toImage(fullImage()),
		"images_zero":         apitype.ImageList{Images: []apitype.Image{}},
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", name+".json")
			if os.Getenv("UPDATE_TESTDATA") != "" {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s changed:\ngot:\n%s\nwant:\n%s", path, got, want)
			}
			// The fixtures' secrets never come out.
			secret := base64.StdEncoding.EncodeToString([]byte("bcjt_secret"))
			for _, s := range []string{"hunter2", secret, "user:pw", "sig=s", "#f", "secret-ish"} {
				if strings.Contains(string(got), s) {
					t.Errorf("%s shows %q", name, s)
				}
			}
		})
	}
}

// TestVocabulary: the constants the CLI compares with (apitype) are the
// ones the store writes.
func TestVocabulary(t *testing.T) {
	for _, c := range []struct{ api, store string }{
		{apitype.ApprovalAuto, store.ApprovalAuto},
		{apitype.ApprovalManual, store.ApprovalManual},
		{apitype.FirmwareBIOS, store.FirmwareBIOS},
		{apitype.FirmwareUEFI, store.FirmwareUEFI},
		{apitype.MachineRegistered, store.MachineRegistered},
		{apitype.MachinePXEBooting, store.MachinePXEBooting},
		{apitype.MachineRamdisk, store.MachineRamdisk},
		{apitype.MachineDeploying, store.MachineDeploying},
		{apitype.MachineInstalling, store.MachineInstalling},
		{apitype.MachineProvisioned, store.MachineProvisioned},
		{apitype.MachineFailed, store.MachineFailed},
	} {
		if c.api != c.store {
			t.Errorf("apitype says %q where the store says %q", c.api, c.store)
		}
	}
}

// FuzzRedactParams: whatever an agent's params hold, no file's content
// comes out.
func FuzzRedactParams(f *testing.F) {
	for _, s := range []string{`{"files":[{"path":"/etc/bcd/join-token","content":"c2VjcmV0LXRva2Vu"}]}`, `{"files":"x"}`, `[1]`, `{"files":[1,{"content":1}]}`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, params []byte) {
		c := toCommand(store.Command{Params: params})
		var obj map[string]json.RawMessage
		if json.Unmarshal(c.Params, &obj) != nil {
			return
		}
		var files []map[string]json.RawMessage
		if json.Unmarshal(obj["files"], &files) != nil {
			return
		}
		for _, file := range files {
			if _, ok := file["content"]; ok {
				t.Fatalf("content survived: %s", c.Params)
			}
		}
	})
}

func upgradingNode() store.Node {
	n := fullNode()
	n.DaemonArch = "arm64"
	n.DaemonTarget = &protocol.DaemonSection{Version: "0.1.2", URL: "https://cp.example.test/downloads/bcd/0.1.2/linux-arm64",
		SHA256: strings.Repeat("ab", 32), Signature: `{"manifest_version":1}`}
	return n
}

// fullRelease has a manifest the api never shows.
func fullRelease() store.Release {
	return store.Release{Version: "0.1.2", Product: "bcd", Sequence: 3, Expires: t1.Add(720 * time.Hour), Manifest: `{"secret-ish":"manifest"}`,
		URLBase: "https://cp.example.test", AddedAt: t1,
		Binaries: []store.ReleaseBinary{{Arch: "amd64", Name: "bcd_0.1.2_linux_amd64", Size: 1234, SHA256: strings.Repeat("cd", 32)}}}
}

func fullRollout() store.Rollout {
	return store.Rollout{ID: "ro_1", Version: "0.1.2", Role: "node", Pool: "pool_a", Site: "fsn1", Waves: []int{50, 100},
		MaxUnavailable: 1, FailureThreshold: 10, WaveTimeout: 30 * time.Minute, State: store.RolloutPaused,
		Reason: "1 of 1 finished nodes failed (100% > 10%): node n1: UpdateFailed: bcd 0.1.2 did not start", Revision: 4,
		CreatedAt: t1, UpdatedAt: t1.Add(time.Minute),
		Nodes: []store.RolloutNode{
			{NodeID: "n1", Pool: "pool_a", Wave: 1, State: store.RolloutNodeFailed, Reason: "UpdateFailed", Message: "bcd 0.1.2 did not start",
				CommandID: "cmd_1", StartedAt: t1, FinishedAt: t1.Add(time.Minute)},
			{NodeID: "n2", Pool: "pool_a", Wave: 2, State: store.RolloutNodePending},
		},
		Timeline: []store.RolloutEvent{{At: t1, Message: "created"}, {At: t1.Add(time.Minute), Message: "paused: …"}}}
}
