package installscript

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/pki"
)

var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var (
	bundleOnce sync.Once
	bundleDir  string
	bundleErr  error
)

// testBundle makes one PKI bundle for the package's tests and returns its
// directory. It lives in a directory of its own that TestMain removes.
func testBundle(t testing.TB) string {
	t.Helper()
	bundleOnce.Do(func() {
		var dir string
		dir, bundleErr = os.MkdirTemp("", "installscript-pki-")
		if bundleErr != nil {
			return
		}
		bundleDir = filepath.Join(dir, "pki")
		_, bundleErr = pki.Init(bundleDir, pki.InitOptions{})
	})
	if bundleErr != nil {
		t.Fatal(bundleErr)
	}
	return bundleDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bundleDir != "" {
		os.RemoveAll(filepath.Dir(bundleDir))
	}
	os.Exit(code)
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// baseRequest is a valid --sha256 request.
func baseRequest(t testing.TB) Request {
	return Request{
		Pool: "pool_h100", Site: "fsn1",
		GatewayURL: "https://gw.eu.example.com",
		BaseURL:    "https://compute.example.com/bc",
		BCDVersion: "0.1.0",
		SHA256:     "amd64=" + strings.Repeat("a", 64) + ",arm64=" + strings.Repeat("b", 64),
		PKIDir:     testBundle(t),
		Now:        testNow,
	}
}

// releaseKey makes a release signing key and returns it with its pin.
func releaseKey(t testing.TB) (*ecdsa.PrivateKey, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "release.key")
	pin, err := pki.GenerateReleaseKey(path)
	if err != nil {
		t.Fatal(err)
	}
	k, err := pki.LoadReleaseKey(path)
	if err != nil {
		t.Fatal(err)
	}
	return k, pin
}

// writeManifest signs a release of the given artifacts (name → content)
// and writes manifest.json into a new directory, returning its path.
func writeManifest(t testing.TB, product, version string, sequence int64, files map[string][]byte, keys ...*ecdsa.PrivateKey) string {
	t.Helper()
	var arts []pki.Artifact
	for name, content := range files {
		arts = append(arts, pki.Artifact{Name: name, Size: int64(len(content)), SHA256: sum(content)})
	}
	data, err := pki.SignRelease(pki.Release{
		Product: product, Version: version, Sequence: sequence,
		Expires: testNow.Add(90 * 24 * time.Hour), Artifacts: arts,
	}, keys)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), pki.ManifestFile)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// releaseFiles are the artifacts of a full release of version v, with
// made-up contents.
func releaseFiles(v string, withPlugin bool) map[string][]byte {
	files := map[string][]byte{
		"bcd_" + v + "_linux_amd64":                   []byte("bcd amd64"),
		"bcd_" + v + "_linux_arm64":                   []byte("bcd arm64"),
		"bcd_" + v + "_linux_amd64.tar.gz":            []byte("archive amd64"),
		"bcd_" + v + "_linux_arm64.tar.gz":            []byte("archive arm64"),
		"bcd_" + v + "_linux_amd64.tar.gz.sha256":     []byte("x"),
		"better-compute_" + v + "_linux_amd64.tar.gz": []byte("bc amd64"),
		"checksums.txt":                               []byte("sums"),
	}
	if withPlugin {
		files["bcx-ipmi_"+v+"_linux_amd64.tar.gz"] = []byte("ipmi amd64")
		files["bcx-ipmi_"+v+"_linux_arm64.tar.gz"] = []byte("ipmi arm64")
	}
	return files
}
