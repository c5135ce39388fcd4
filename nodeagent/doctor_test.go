package nodeagent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

func runDoctor(t *testing.T, path string, o DoctorOptions) (map[string]Result, string, bool) {
	t.Helper()
	checks := DoctorChecks(path, o)
	var out bytes.Buffer
	failed := RunChecks(context.Background(), &out, checks)
	results := map[string]Result{}
	for _, c := range checks {
		results[c.Name()] = c.Run(context.Background())
	}
	return results, out.String(), failed
}

func TestDoctorAllGood(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleNode)
	res, out, failed := runDoctor(t, f.cfgPath, DoctorOptions{ExpiryWarning: time.Minute})
	if failed {
		t.Fatalf("doctor failed:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[4], "update: warn: no [update] release_pins") || !strings.HasPrefix(lines[0], "config: ok: ") || !strings.HasPrefix(lines[1], "identity: ok: ") ||
		!strings.HasPrefix(lines[2], "tpm: ok: ") || !strings.HasPrefix(lines[3], "gateway: ok: ") {
		t.Errorf("output:\n%s", out)
	}
	if !strings.Contains(res["identity"].Detail, "node node_a") {
		t.Errorf("identity detail %q", res["identity"].Detail)
	}
}

func TestDoctorConfigPermissions(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleNode)
	os.Chmod(f.cfgPath, 0o644)
	res, out, failed := runDoctor(t, f.cfgPath, DoctorOptions{})
	if failed || res["config"].Level != Warn || !strings.Contains(res["config"].Detail, "readable by others") {
		t.Errorf("failed=%v config=%+v\n%s", failed, res["config"], out)
	}
}

func TestDoctorBadConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(path, []byte("gateway_url = \"https://x\"\nretries = 3\n"), 0o600)
	res, _, failed := runDoctor(t, path, DoctorOptions{})
	if !failed || res["config"].Level != Fail || !strings.Contains(res["config"].Detail, "retries") {
		t.Errorf("config = %+v", res["config"])
	}
	if res["identity"].Level != Fail || res["gateway"].Level != Fail {
		t.Errorf("identity %+v gateway %+v", res["identity"], res["gateway"])
	}
}

func TestDoctorIdentity(t *testing.T) {
	// Not joined.
	f := newNodeFixture(t, protocol.RoleNode)
	os.Remove(filepath.Join(f.dataDir, agent.IdentityFile))
	res, _, failed := runDoctor(t, f.cfgPath, DoctorOptions{})
	if !failed || res["identity"].Level != Fail || !strings.Contains(res["identity"].Detail, "not joined") {
		t.Errorf("not joined: %+v", res["identity"])
	}

	// A key that does not match: does not load.
	f = newNodeFixture(t, protocol.RoleNode)
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pemKey, _ := pki.MarshalPKCS8PEM(k)
	os.WriteFile(filepath.Join(f.dataDir, agent.KeyFile), pemKey, 0o600)
	res, _, _ = runDoctor(t, f.cfgPath, DoctorOptions{})
	if res["identity"].Level != Fail || !strings.HasSuffix(res["identity"].Detail, "bcd join --reset --yes, then bcd join") {
		t.Errorf("mismatched key: %+v", res["identity"])
	}

	// Expired.
	f = newNodeFixture(t, protocol.RoleNode)
	res, _, _ = runDoctor(t, f.cfgPath, DoctorOptions{Now: func() time.Time { return time.Now().Add(48 * time.Hour) }})
	if res["identity"].Level != Fail || !strings.Contains(res["identity"].Detail, "expired") ||
		!strings.HasSuffix(res["identity"].Detail, "bcd join --reset --yes, then bcd join") {
		t.Errorf("expired: %+v", res["identity"])
	}

	// A fresh one-hour certificate is fine; within its last third it warns.
	res, _, _ = runDoctor(t, f.cfgPath, DoctorOptions{})
	if res["identity"].Level != OK || !strings.Contains(res["identity"].Detail, "certificate valid until") {
		t.Errorf("a fresh one-hour certificate: %+v, want ok with its expiry", res["identity"])
	}
	res, _, _ = runDoctor(t, f.cfgPath, DoctorOptions{Now: func() time.Time { return time.Now().Add(25 * time.Minute) }})
	if res["identity"].Level != OK {
		t.Errorf("a one-hour certificate 25 minutes in: %+v, want ok", res["identity"])
	}
	res, _, _ = runDoctor(t, f.cfgPath, DoctorOptions{Now: func() time.Time { return time.Now().Add(45 * time.Minute) }})
	if res["identity"].Level != Warn || !strings.Contains(res["identity"].Detail, "last third") {
		t.Errorf("a one-hour certificate 45 minutes in: %+v, want a warning", res["identity"])
	}
}

func TestDoctorGateway(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleNode)
	// A port nothing listens on.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	c := *f.cfg
	c.GatewayURL = "https://" + addr
	os.WriteFile(f.cfgPath, config.Format(&c), 0o600)
	res, _, failed := runDoctor(t, f.cfgPath, DoctorOptions{GatewayTimeout: 2 * time.Second})
	if !failed || res["gateway"].Level != Fail {
		t.Errorf("unreachable gateway: %+v", res["gateway"])
	}

	// The gateway is there, but its CA is not the pinned one.
	c = *f.cfg
	c.ServingCASPKIPin = c.JoinSigningKeyPin
	os.WriteFile(f.cfgPath, config.Format(&c), 0o600)
	res, _, _ = runDoctor(t, f.cfgPath, DoctorOptions{})
	if res["gateway"].Level != Fail || !strings.Contains(res["gateway"].Detail, "serving_ca_spki_pin") {
		t.Errorf("unpinned gateway: %+v", res["gateway"])
	}
}
