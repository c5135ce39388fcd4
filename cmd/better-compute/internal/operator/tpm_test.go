package operator

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/protocol"
)

// testEK writes a public key as an EK file (PEM, or DER) and returns its
// path and SHA-256.
func testEK(t *testing.T, asPEM bool) (string, string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(der)
	data := der
	if asPEM {
		data = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	}
	path := filepath.Join(t.TempDir(), "ek")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, hex.EncodeToString(sum[:])
}

func TestTPMEnrollListRevoke(t *testing.T) {
	controlPlane(t)
	if code, _, errOut := runCLI(t, "", "sites", "create", "fsn1"); code != 0 {
		t.Fatalf("sites create: %d %s", code, errOut)
	}
	code, out, errOut := runCLI(t, "", "machines", "add", "--site", "fsn1", "--mac", "52:54:00:aa:00:01", "--name", "tpm1")
	if code != 0 {
		t.Fatalf("machines add: %d %s", code, errOut)
	}
	pemFile, pemHash := testEK(t, true)
	derFile, derHash := testEK(t, false)

	// A machine's EK, from a PEM file.
	code, out, errOut = runCLI(t, "", "machines", "enroll-tpm", "tpm1", "--ek-file", pemFile, "--pool", "pool_tpm")
	if code != 0 || !strings.Contains(out, pemHash) || !strings.Contains(out, "pool pool_tpm") {
		t.Fatalf("machines enroll-tpm: %d %q %s", code, out, errOut)
	}
	if code, out, _ = runCLI(t, "", "machines", "show", "tpm1"); code != 0 || !strings.Contains(out, "TPM EK:") || !strings.Contains(out, pemHash+" (pool pool_tpm)") {
		t.Errorf("machines show: %d\n%s", code, out)
	}
	if _, out, _ = runCLI(t, "", "machines", "events", "tpm1"); !strings.Contains(out, protocol.MachineEventTPM) {
		t.Errorf("machines events has no %s entry:\n%s", protocol.MachineEventTPM, out)
	}

	// An allow-list entry, from a DER file, and one by its hash.
	code, out, errOut = runCLI(t, "", "tpm", "enroll", "--site", "fsn1", "--pool", "pool_b", "--ek-file", derFile)
	if code != 0 || !strings.Contains(out, derHash) {
		t.Fatalf("tpm enroll --ek-file: %d %q %s", code, out, errOut)
	}
	other := strings.Repeat("ab", 32)
	if code, _, errOut = runCLI(t, "", "tpm", "enroll", "--site", "fsn1", "--pool", "pool_b", "--ek-sha256", strings.ToUpper(other)); code != 0 {
		t.Fatalf("tpm enroll --ek-sha256: %d %s", code, errOut)
	}
	// The machine's EK cannot become an allow-list entry.
	code, _, errOut = runCLI(t, "", "tpm", "enroll", "--site", "fsn1", "--pool", "pool_b", "--ek-sha256", pemHash)
	if code != 1 || !strings.Contains(errOut, "ALREADY_EXISTS") || !strings.Contains(errOut, "belongs to machine") {
		t.Errorf("enroll of a machine's EK: %d %s", code, errOut)
	}
	for _, args := range [][]string{
		{"tpm", "enroll", "--site", "fsn1", "--pool", "p"},
		{"tpm", "enroll", "--site", "fsn1", "--pool", "p", "--ek-sha256", "xyz"},
		{"tpm", "enroll", "--pool", "p", "--ek-sha256", other},
		{"machines", "enroll-tpm", "tpm1", "--ek-file", derFile, "--ek-sha256", other},
	} {
		if code, _, _ := runCLI(t, "", args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	if code, _, errOut = runCLI(t, "", "tpm", "enroll", "--site", "nowhere", "--pool", "p", "--ek-sha256", other); code != 1 || !strings.Contains(errOut, "NOT_FOUND") {
		t.Errorf("enroll in a missing site: %d %s", code, errOut)
	}

	code, out, _ = runCLI(t, "", "tpm", "list")
	if code != 0 || !strings.Contains(out, "EK SHA-256") || !strings.Contains(out, pemHash) || !strings.Contains(out, derHash) || !strings.Contains(out, other) {
		t.Errorf("tpm list: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "", "tpm", "list", "-o", "json")
	var list []apitype.TPMEnrollment
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 3 {
		t.Fatalf("tpm list -o json: %d %s", code, out)
	}
	for _, e := range list {
		if (e.EKSHA256 == pemHash) != (e.MachineID != "") {
			t.Errorf("enrollment %+v", e)
		}
	}

	// Revoking the machine's EK takes it off the machine.
	if code, out, _ = runCLI(t, "", "tpm", "revoke", pemHash); code != 0 || !strings.Contains(out, "no longer enrolled") || !strings.Contains(out, "machine m_") {
		t.Errorf("tpm revoke of the machine's: %d %s", code, out)
	}
	if _, out, _ = runCLI(t, "", "machines", "show", "tpm1", "-o", "json"); strings.Contains(out, pemHash) {
		t.Errorf("machine still shows the revoked EK:\n%s", out)
	}
	if code, _, _ = runCLI(t, "", "tpm", "revoke", derHash); code != 0 {
		t.Errorf("tpm revoke of an entry: %d", code)
	}
	if code, _, errOut = runCLI(t, "", "tpm", "revoke", derHash); code != 1 || !strings.Contains(errOut, "NOT_FOUND") {
		t.Errorf("revoke again: %d %s", code, errOut)
	}
	if _, out, _ = runCLI(t, "", "tpm", "list"); strings.Contains(out, derHash) || !strings.Contains(out, other) {
		t.Errorf("tpm list after revokes:\n%s", out)
	}
	// --clear removes a machine's enrollment.
	runCLI(t, "", "machines", "enroll-tpm", "tpm1", "--ek-sha256", derHash)
	if code, out, _ = runCLI(t, "", "machines", "enroll-tpm", "tpm1", "--clear"); code != 0 || !strings.Contains(out, "no TPM enrolled") {
		t.Errorf("enroll-tpm --clear: %d %s", code, out)
	}
}

func TestPoolsSetPolicy(t *testing.T) {
	s, _ := controlPlane(t)
	if code, _, errOut := runCLI(t, "", "sites", "create", "fsn1"); code != 0 {
		t.Fatalf("sites create: %d %s", code, errOut)
	}
	if code, out, _ := runCLI(t, "", "pools", "show", "pool_tpm"); code != 0 || !strings.Contains(out, "any attestor") {
		t.Errorf("pools show without a policy: %d %s", code, out)
	}
	code, out, errOut := runCLI(t, "", "pools", "set-policy", "pool_tpm", "--join-attestors", "tpm")
	if code != 0 || !strings.Contains(out, "pool pool_tpm: tpm") {
		t.Fatalf("pools set-policy: %d %q %s", code, out, errOut)
	}
	if code, out, _ = runCLI(t, "", "pools", "show", "pool_tpm"); code != 0 || !strings.Contains(out, "JOIN ATTESTORS:") || !strings.Contains(out, "tpm") {
		t.Errorf("pools show: %d %s", code, out)
	}
	if code, out, _ = runCLI(t, "", "pools", "list"); code != 0 || !strings.Contains(out, "pool_tpm") {
		t.Errorf("pools list: %d %s", code, out)
	}
	if code, _, errOut = runCLI(t, "", "pools", "set-policy", "pool_tpm", "--join-attestors", "tpm,magic"); code != 1 || !strings.Contains(errOut, "INVALID_INPUT") {
		t.Errorf("an unknown attestor: %d %s", code, errOut)
	}
	if code, _, _ = runCLI(t, "", "pools", "set-policy", "pool_tpm"); code != 2 {
		t.Errorf("set-policy without --join-attestors or --max-unavailable: exit %d, want 2", code)
	}

	// A token join into the pool, through serve's gateway: refused, token unused.
	code, tok, errOut := runCLI(t, "", "tokens", "create", "--pool", "pool_tpm", "--site", "fsn1", "--role", "node")
	if code != 0 {
		t.Fatalf("tokens create: %d %s", code, errOut)
	}
	tok = strings.TrimSpace(tok)
	hc := cptest.HTTPClient(s.Bundle().Public.ServingCAPool(), nil)
	a := cptest.NewAgent(t)
	_, er := cptest.PostJoin(t, hc, s.AdvertisedGatewayURL(), a.Request(t, s.Bundle(), protocol.RoleNode, tok, nil))
	if er == nil || er.Code != protocol.CodeAttestorNotAllowed || !strings.Contains(er.Message, "pool pool_tpm") {
		t.Fatalf("token join into a tpm-only pool: %+v", er)
	}
	// With join-token allowed again, the same token joins.
	if code, out, _ = runCLI(t, "", "pools", "set-policy", "pool_tpm", "--join-attestors", "tpm,join-token"); code != 0 || !strings.Contains(out, "tpm, join-token") {
		t.Fatalf("pools set-policy tpm,join-token: %d %s", code, out)
	}
	jr, er := cptest.PostJoin(t, hc, s.AdvertisedGatewayURL(), a.Request(t, s.Bundle(), protocol.RoleNode, tok, nil))
	if er != nil {
		t.Fatalf("join after the policy allows join-token: %+v", er)
	}
	a.Verify(t, s.Bundle(), jr)
	// '' removes the policy.
	if code, out, _ = runCLI(t, "", "pools", "set-policy", "pool_tpm", "--join-attestors", ""); code != 0 || !strings.Contains(out, "any attestor") {
		t.Errorf("set-policy '': %d %s", code, out)
	}
	if _, out, _ = runCLI(t, "", "pools", "list"); strings.Contains(out, "pool_tpm") {
		t.Errorf("pools list after removing the policy:\n%s", out)
	}
	// The disruption budget: set alone it keeps the attestors, set with
	// them it keeps itself, 0 unsets it, a negative one is a usage error.
	if code, out, _ = runCLI(t, "", "pools", "set-policy", "pool_tpm", "--join-attestors", "tpm"); code != 0 {
		t.Fatalf("set-policy tpm: %d %s", code, out)
	}
	if code, out, _ = runCLI(t, "", "pools", "set-policy", "pool_tpm", "--max-unavailable", "3"); code != 0 || !strings.Contains(out, "pool pool_tpm: tpm; disruption budget 3") {
		t.Fatalf("set-policy --max-unavailable 3: %d %s", code, out)
	}
	if code, out, _ = runCLI(t, "", "pools", "set-policy", "pool_tpm", "--join-attestors", "tpm,join-token"); code != 0 || !strings.Contains(out, "tpm, join-token; disruption budget 3") {
		t.Fatalf("set-policy after a budget: %d %s", code, out)
	}
	if code, out, _ = runCLI(t, "", "pools", "show", "pool_tpm", "-o", "json"); code != 0 || !strings.Contains(out, `"max_unavailable": 3`) {
		t.Errorf("pools show -o json: %d %s", code, out)
	}
	if code, _, _ = runCLI(t, "", "pools", "set-policy", "pool_tpm", "--max-unavailable", "-1"); code != 2 {
		t.Errorf("--max-unavailable -1: exit %d, want 2", code)
	}
	if code, out, _ = runCLI(t, "", "pools", "set-policy", "pool_tpm", "--max-unavailable", "0", "--join-attestors", ""); code != 0 || !strings.Contains(out, "disruption budget 1 (not set)") {
		t.Errorf("unset both: %d %s", code, out)
	}
	if _, out, _ = runCLI(t, "", "pools", "list"); strings.Contains(out, "pool_tpm") {
		t.Errorf("pools list after unsetting both:\n%s", out)
	}
}
