package operator

import (
	"context"
	"encoding/json"
	"github.com/better-compute/bcd/internal/syncbuf"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

var bcopRE = regexp.MustCompile(`bcop_[a-z2-7]{52}`)

// controlPlane starts an in-process control plane on loopback and points
// the CLI's environment at it: server URL, operator token, serving CA.
func controlPlane(t *testing.T) (*controlplane.Server, string) {
	t.Helper()
	return controlPlaneWith(t, nil)
}

// controlPlaneWith is controlPlane with the server changed by mut first.
func controlPlaneWith(t *testing.T, mut func(*controlplane.Server)) (*controlplane.Server, string) {
	t.Helper()
	pkiDir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(pkiDir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	out := &syncbuf.Buffer{}
	s := &controlplane.Server{PKIDir: pkiDir, DataDir: filepath.Join(t.TempDir(), "data"),
		APIListen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", Out: out}
	if mut != nil {
		mut(s)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	tok := bcopRE.FindString(out.String())
	t.Setenv(envServer, s.APIURL())
	t.Setenv(envToken, tok)
	t.Setenv(envPKI, pkiDir)
	return s, tok
}

func TestTokensCreatePrintsOnlyTheToken(t *testing.T) {
	controlPlane(t)
	if code, _, errOut := runCLI(t, "", "sites", "create", "fsn1"); code != 0 {
		t.Fatalf("sites create: %d %s", code, errOut)
	}
	code, out, errOut := runCLI(t, "", "tokens", "create", "--pool", "pool_h100", "--site", "fsn1", "--role", "node", "--ttl", "2h")
	if code != 0 {
		t.Fatalf("tokens create: %d %s", code, errOut)
	}
	if !regexp.MustCompile(`^bcjt_jt_[0-9a-z]{26}_[a-z2-7]{52}\n$`).MatchString(out) {
		t.Errorf("stdout is %q, want the token and a newline only", out)
	}
	if !strings.Contains(errOut, "pool pool_h100") || !strings.Contains(errOut, "site fsn1") || strings.Contains(errOut, "bcjt_") {
		t.Errorf("stderr %q", errOut)
	}
	id := strings.Split(strings.TrimPrefix(out, "bcjt_"), "_")[0] + "_" + strings.Split(strings.TrimPrefix(out, "bcjt_"), "_")[1]

	code, out, _ = runCLI(t, "", "tokens", "list")
	if code != 0 || !strings.Contains(out, "ID") || !strings.Contains(out, id) || !strings.Contains(out, "active") || strings.Contains(out, "bcjt_") {
		t.Errorf("tokens list: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "", "tokens", "list", "-o", "json")
	var list []apitype.TokenInfo
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ID != id {
		t.Errorf("tokens list -o json: %d %s", code, out)
	}
	if code, out, _ = runCLI(t, "", "tokens", "revoke", id); code != 0 || !strings.Contains(out, "revoked") {
		t.Errorf("tokens revoke: %d %s", code, out)
	}
	if _, out, _ = runCLI(t, "", "tokens", "list"); !strings.Contains(out, "revoked") {
		t.Errorf("after revoke:\n%s", out)
	}
	// A site that does not exist: NOT_FOUND, exit 1.
	code, _, errOut = runCLI(t, "", "tokens", "create", "--pool", "p", "--site", "nowhere", "--role", "node")
	if code != 1 || !strings.Contains(errOut, "NOT_FOUND") {
		t.Errorf("token for a missing site: %d %s", code, errOut)
	}
	// Missing flags are usage errors.
	if code, _, _ = runCLI(t, "", "tokens", "create", "--pool", "p", "--site", "fsn1"); code != 2 {
		t.Errorf("tokens create without --role: exit %d, want 2", code)
	}
}

func TestOperatorTokenNeverFromArgv(t *testing.T) {
	_, tok := controlPlane(t)
	if code, _, _ := runCLI(t, "", "nodes", "list", "--token", tok); code != 2 {
		t.Errorf("--token accepted: exit %d", code)
	}
	t.Setenv(envToken, "")
	code, out, errOut := runCLI(t, "", "nodes", "list")
	if code != 2 || !strings.Contains(errOut, envToken) {
		t.Errorf("without a token: %d %q", code, errOut)
	}
	if strings.Contains(out+errOut, tok) {
		t.Error("the token was printed")
	}
	// --token-file, 0600 only.
	file := filepath.Join(t.TempDir(), "op")
	os.WriteFile(file, []byte(tok+"\n"), 0o644)
	if code, _, errOut = runCLI(t, "", "nodes", "list", "--token-file", file); code != 1 || !strings.Contains(errOut, "chmod 600") {
		t.Errorf("0644 token file: %d %s", code, errOut)
	}
	os.Chmod(file, 0o600)
	if code, _, errOut = runCLI(t, "", "nodes", "list", "--token-file", file); code != 0 {
		t.Errorf("0600 token file: %d %s", code, errOut)
	}
	// A wrong token: UNAUTHENTICATED, exit 1.
	t.Setenv(envToken, "bcop_"+strings.Repeat("a", 52))
	if code, _, errOut = runCLI(t, "", "nodes", "list"); code != 1 || !strings.Contains(errOut, "UNAUTHENTICATED") {
		t.Errorf("wrong token: %d %s", code, errOut)
	}
}

func TestTrust(t *testing.T) {
	s, _ := controlPlane(t)
	// The system roots do not know the serving CA.
	t.Setenv(envPKI, "")
	if code, _, errOut := runCLI(t, "", "sites", "list"); code != 1 || !strings.Contains(errOut, "certificate") {
		t.Errorf("system roots: %d %s", code, errOut)
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, []byte(s.Bundle().Public.ServingCAPEM), 0o644)
	if code, _, errOut := runCLI(t, "", "sites", "list", "--ca-file", ca); code != 0 {
		t.Errorf("--ca-file: %d %s", code, errOut)
	}
	if code, _, _ := runCLI(t, "", "sites", "list", "--ca-file", ca, "--pki", s.Bundle().Dir); code != 2 {
		t.Errorf("--ca-file with --pki: exit %d, want 2", code)
	}
	if code, _, errOut := runCLI(t, "", "sites", "list", "--pki", s.Bundle().Dir, "--server", s.APIURL()); code != 0 {
		t.Errorf("--pki --server: %d %s", code, errOut)
	}
}

func TestNodesCommands(t *testing.T) {
	s, _ := controlPlane(t)
	now := time.Now()
	st := s.Store()
	st.CreateSite(context.Background(), store.Site{Name: "fsn1", CreatedAt: now})
	node := store.Node{ID: "n_01jz0000000000000000000000", Role: "node", Site: "fsn1", Pool: "pool_a", SPIFFEID: "spiffe://x/node/n", CertSerial: "1",
		CertNotAfter: now.Add(time.Hour), State: protocol.NodeReady}
	if err := st.Admit(context.Background(), store.Admission{Node: node, Now: now}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "", "nodes", "list")
	if code != 0 {
		t.Fatalf("nodes list: %d %s", code, errOut)
	}
	for _, col := range []string{"NODE", "ROLE", "SITE", "POOL", "STATE", "CONNECTED", "VERSION", "LAST SEEN", "CERT EXPIRES", node.CertNotAfter.UTC().Format(time.RFC3339), node.ID, "pool_a", "ready"} {
		if !strings.Contains(out, col) {
			t.Errorf("nodes list lacks %q:\n%s", col, out)
		}
	}
	if code, out, _ = runCLI(t, "", "nodes", "cordon", node.ID); code != 0 || !strings.Contains(out, "cordoned") {
		t.Errorf("cordon: %d %s", code, out)
	}
	if _, out, _ = runCLI(t, "", "nodes", "list"); !strings.Contains(out, "ready,cordoned") {
		t.Errorf("after cordon:\n%s", out)
	}
	if code, out, _ = runCLI(t, "", "nodes", "uncordon", node.ID); code != 0 || !strings.Contains(out, "uncordoned") {
		t.Errorf("uncordon: %d %s", code, out)
	}
	code, out, errOut = runCLI(t, "", "nodes", "reboot", node.ID)
	if code != 0 || !regexp.MustCompile(`^cmd_[0-9a-z]{26}\n$`).MatchString(out) {
		t.Fatalf("reboot: %d %q %s", code, out, errOut)
	}
	cmdID := strings.TrimSpace(out)
	if code, out, _ = runCLI(t, "", "commands", "get", cmdID); code != 0 || !strings.Contains(out, "node.reboot") || !strings.Contains(out, "PENDING") {
		t.Errorf("commands get: %d %s", code, out)
	}
	if code, out, _ = runCLI(t, "", "commands", "get", cmdID, "-o", "json"); code != 0 || !strings.Contains(out, `"kind": "node.reboot"`) {
		t.Errorf("commands get -o json: %d %s", code, out)
	}
	// delete without --yes: exit 2, saying what it would delete.
	code, _, errOut = runCLI(t, "", "nodes", "delete", node.ID)
	if code != 2 || !strings.Contains(errOut, "would delete node "+node.ID) || !strings.Contains(errOut, "--yes") {
		t.Errorf("delete without --yes: %d %s", code, errOut)
	}
	if n, _ := st.GetNode(context.Background(), node.ID); n.Deleted() {
		t.Fatal("deleted without --yes")
	}
	if code, out, _ = runCLI(t, "", "nodes", "delete", node.ID, "--yes"); code != 0 || !strings.Contains(out, "deleted") {
		t.Errorf("delete --yes: %d %s", code, out)
	}
	if code, _, errOut = runCLI(t, "", "nodes", "reboot", node.ID); code != 1 || !strings.Contains(errOut, "NODE_REVOKED") {
		t.Errorf("reboot a deleted node: %d %s", code, errOut)
	}
	if code, _, errOut = runCLI(t, "", "nodes", "delete", "n_missing"); code != 1 || !strings.Contains(errOut, "NOT_FOUND") {
		t.Errorf("delete a missing node: %d %s", code, errOut)
	}
	if code, _, _ = runCLI(t, "", "nodes", "reboot"); code != 2 {
		t.Errorf("reboot without a node: exit %d", code)
	}
}
