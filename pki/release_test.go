package pki

import (
	"crypto/ecdsa"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var releaseNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func testRelease() Release {
	return Release{
		Product:  "bcd",
		Version:  "0.2.0",
		Sequence: 7,
		Expires:  releaseNow.Add(30 * 24 * time.Hour),
		Artifacts: []Artifact{
			{Name: "bcd_0.2.0_linux_arm64", Size: 3, SHA256: strings.Repeat("b", 64)},
			{Name: "bcd_0.2.0_linux_amd64", Size: 3, SHA256: strings.Repeat("a", 64)},
		},
	}
}

func releaseKeys(t *testing.T, n int) ([]*ecdsa.PrivateKey, []string) {
	t.Helper()
	var keys []*ecdsa.PrivateKey
	var pins []string
	for range n {
		k, err := newKey()
		if err != nil {
			t.Fatal(err)
		}
		pin, err := SPKIPin(&k.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
		pins = append(pins, pin)
	}
	return keys, pins
}

func policy(pins []string, threshold int) ReleasePolicy {
	return ReleasePolicy{Pins: pins, Threshold: threshold, Product: "bcd", Version: "0.2.0", MinSequence: 7, Now: releaseNow}
}

func sign(t *testing.T, r Release, keys ...*ecdsa.PrivateKey) []byte {
	t.Helper()
	out, err := SignRelease(r, keys)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// editManifest decodes manifest.json, lets f change it and encodes it again.
func editManifest(t *testing.T, data []byte, f func(m *Manifest)) []byte {
	t.Helper()
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	f(&m)
	out, err := json.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReleaseRoundTrip(t *testing.T) {
	keys, pins := releaseKeys(t, 1)
	data := sign(t, testRelease(), keys[0])
	r, err := VerifyRelease(data, policy(pins, 1))
	if err != nil {
		t.Fatal(err)
	}
	if r.Product != "bcd" || r.Version != "0.2.0" || r.Sequence != 7 {
		t.Errorf("release = %+v", r)
	}
	// Signing sorts the artifacts, so lookups by name work.
	a, ok := r.Artifact("bcd_0.2.0_linux_amd64")
	if !ok || a.SHA256 != strings.Repeat("a", 64) || a.Size != 3 {
		t.Errorf("amd64 artifact = %+v, %v", a, ok)
	}
	if _, ok := r.Artifact("bcd_0.2.0_linux_riscv64"); ok {
		t.Error("found an artifact that is not listed")
	}
	// A reader's reformatting (indentation, member order) changes no meaning.
	compact := editManifest(t, data, func(*Manifest) {})
	if _, err := VerifyRelease(compact, policy(pins, 1)); err != nil {
		t.Errorf("re-encoded manifest: %v", err)
	}
	// A leading v on the wanted version names the same release.
	p := policy(pins, 1)
	p.Version = "v0.2.0"
	if _, err := VerifyRelease(data, p); err != nil {
		t.Errorf("version v0.2.0: %v", err)
	}
}

func TestReleaseThreshold(t *testing.T) {
	keys, pins := releaseKeys(t, 3)
	two := sign(t, testRelease(), keys[0], keys[2])
	if _, err := VerifyRelease(two, policy(pins, 2)); err != nil {
		t.Fatalf("2 of 3 with threshold 2: %v", err)
	}
	if _, err := VerifyRelease(two, policy(pins, 3)); !errors.Is(err, ErrReleaseUntrusted) {
		t.Fatalf("2 of 3 with threshold 3: %v, want RELEASE_UNTRUSTED", err)
	}
	one := sign(t, testRelease(), keys[1])
	if _, err := VerifyRelease(one, policy(pins, 2)); !errors.Is(err, ErrReleaseUntrusted) {
		t.Fatalf("1 of 3 with threshold 2: %v, want RELEASE_UNTRUSTED", err)
	}
}

func TestReleaseOneKeyTwiceCountsOnce(t *testing.T) {
	keys, pins := releaseKeys(t, 2)
	data := sign(t, testRelease(), keys[0])
	body, err := func() ([]byte, error) { r := testRelease(); return sortedCanonical(&r) }()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Sign(keys[0], PurposeReleaseManifest, body) // a second, different ECDSA signature
	if err != nil {
		t.Fatal(err)
	}
	twice := editManifest(t, data, func(m *Manifest) {
		m.Signatures = append(m.Signatures, ManifestSignature{KeyPin: pins[0], JWS: again})
	})
	// Both signatures are valid on their own.
	if _, err := VerifyRelease(twice, policy(pins, 1)); err != nil {
		t.Fatalf("threshold 1: %v", err)
	}
	_, err = VerifyRelease(twice, policy(pins, 2))
	if !errors.Is(err, ErrReleaseUntrusted) || !strings.Contains(err.Error(), "signed by 1 distinct") {
		t.Fatalf("one key twice, threshold 2: %v", err)
	}
	// The signer refuses to produce such a manifest in the first place.
	if _, err := SignRelease(testRelease(), []*ecdsa.PrivateKey{keys[0], keys[0]}); err == nil {
		t.Error("SignRelease accepted the same key twice")
	}
}

func sortedCanonical(r *Release) ([]byte, error) {
	r.Artifacts = []Artifact{r.Artifacts[1], r.Artifacts[0]}
	return r.Canonical()
}

func TestReleaseRefusals(t *testing.T) {
	keys, pins := releaseKeys(t, 3)
	data := sign(t, testRelease(), keys[0])
	for _, tc := range []struct {
		name string
		edit func(p *ReleasePolicy)
		want error
		text string
	}{
		{"wrong product", func(p *ReleasePolicy) { p.Product = "bcx-ipmi" }, ErrReleaseMismatch, `for product "bcd", want "bcx-ipmi"`},
		{"wrong version", func(p *ReleasePolicy) { p.Version = "0.2.1" }, ErrReleaseMismatch, "is for bcd 0.2.0, want 0.2.1"},
		{"expired", func(p *ReleasePolicy) { p.Now = releaseNow.Add(31 * 24 * time.Hour) }, ErrReleaseExpired, "expired at"},
		{"expiry instant", func(p *ReleasePolicy) { p.Now = releaseNow.Add(30 * 24 * time.Hour) }, ErrReleaseExpired, "expired at"},
		{"below the floor", func(p *ReleasePolicy) { p.MinSequence = 8 }, ErrReleaseRollback, "sequence 7, below the floor 8"},
		{"unknown signer", func(p *ReleasePolicy) { p.Pins = pins[1:] }, ErrReleaseUntrusted, "signed by 0 distinct"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policy(pins, 1)
			tc.edit(&p)
			r, err := VerifyRelease(data, p)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.want, tc.text)
			}
			if !strings.HasPrefix(err.Error(), tc.want.Error()+": ") {
				t.Errorf("error %q does not start with its code", err)
			}
			if r != nil {
				t.Error("a refused release was returned")
			}
		})
	}
	// At the floor is fine: the floor is the release the node already runs.
	if _, err := VerifyRelease(data, policy(pins, 1)); err != nil {
		t.Errorf("at the floor: %v", err)
	}
}

func TestReleaseTamperedBody(t *testing.T) {
	keys, pins := releaseKeys(t, 1)
	data := sign(t, testRelease(), keys[0])
	for name, edit := range map[string]func(m *Manifest){
		"digest":   func(m *Manifest) { m.Release.Artifacts[0].SHA256 = strings.Repeat("c", 64) },
		"size":     func(m *Manifest) { m.Release.Artifacts[1].Size++ },
		"sequence": func(m *Manifest) { m.Release.Sequence = 99 },
		"expiry":   func(m *Manifest) { m.Release.Expires = m.Release.Expires.Add(time.Hour) },
		"added": func(m *Manifest) {
			m.Release.Artifacts = append(m.Release.Artifacts, Artifact{Name: "zz", Size: 1, SHA256: strings.Repeat("d", 64)})
		},
		"version": func(m *Manifest) {
			m.Release.Version = "0.2.1"
		},
	} {
		t.Run(name, func(t *testing.T) {
			bad := editManifest(t, data, edit)
			p := policy(pins, 1)
			p.Version = ""
			_, err := VerifyRelease(bad, p)
			if !errors.Is(err, ErrReleaseUntrusted) || !strings.Contains(err.Error(), "signs another release body") {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestReleaseOtherPurposeRefused(t *testing.T) {
	keys, pins := releaseKeys(t, 1)
	r := testRelease()
	data := sign(t, r, keys[0])
	body, err := sortedCanonical(&r)
	if err != nil {
		t.Fatal(err)
	}
	// The same key, the same body, but signed as a join response: a join
	// signing key that doubles as a release key must not turn its join
	// answers into releases.
	jws, err := Sign(keys[0], PurposeJoinResponse, body)
	if err != nil {
		t.Fatal(err)
	}
	other := editManifest(t, data, func(m *Manifest) {
		m.Signatures = []ManifestSignature{{KeyPin: pins[0], JWS: jws}}
	})
	_, err = VerifyRelease(other, policy(pins, 1))
	if !errors.Is(err, ErrReleaseUntrusted) || !strings.Contains(err.Error(), PurposeHeader) {
		t.Fatalf("err = %v", err)
	}
}

func TestReleaseKeyPinCannotLie(t *testing.T) {
	keys, pins := releaseKeys(t, 2)
	data := sign(t, testRelease(), keys[1]) // unpinned key
	lying := editManifest(t, data, func(m *Manifest) { m.Signatures[0].KeyPin = pins[0] })
	_, err := VerifyRelease(lying, policy(pins[:1], 1))
	if !errors.Is(err, ErrReleaseUntrusted) || !errors.Is(err, ErrReleaseUntrusted) {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(err.Error(), "not pinned") {
		t.Errorf("err = %v, want it to say the key is not the pinned one", err)
	}
}

func TestReleasePolicyErrors(t *testing.T) {
	keys, pins := releaseKeys(t, 2)
	data := sign(t, testRelease(), keys[0])
	for name, edit := range map[string]func(p *ReleasePolicy){
		"no pins":            func(p *ReleasePolicy) { p.Pins = nil },
		"zero threshold":     func(p *ReleasePolicy) { p.Threshold = 0 },
		"threshold too high": func(p *ReleasePolicy) { p.Threshold = 3 },
		"duplicate pins":     func(p *ReleasePolicy) { p.Pins = []string{pins[0], pins[0]}; p.Threshold = 2 },
		"bad pin":            func(p *ReleasePolicy) { p.Pins = []string{"sha256/nope"} },
		"no product":         func(p *ReleasePolicy) { p.Product = "" },
		"no time":            func(p *ReleasePolicy) { p.Now = time.Time{} },
	} {
		p := policy(pins, 1)
		edit(&p)
		if _, err := VerifyRelease(data, p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestArtifactsOfAndKeys(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"bcd_0.2.0_linux_amd64": "abc",
		"checksums.txt":         "",
		ManifestFile:            "old",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "bcd_linux_amd64_v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	arts, err := ArtifactsOf(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(arts) != 2 || arts[0].Name != "bcd_0.2.0_linux_amd64" || arts[1].Name != "checksums.txt" {
		t.Fatalf("artifacts = %+v", arts)
	}
	if arts[0].Size != 3 || arts[0].SHA256 != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("abc = %+v", arts[0])
	}
	if err := os.Symlink("checksums.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := ArtifactsOf(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("symlink artifact: %v", err)
	}

	keyPath := filepath.Join(t.TempDir(), "release.key")
	pin, err := GenerateReleaseKey(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(keyPath)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	k, err := LoadReleaseKey(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := SPKIPin(&k.PublicKey); got != pin {
		t.Errorf("pin %s, key %s", pin, got)
	}
	if _, err := GenerateReleaseKey(keyPath); err == nil {
		t.Error("GenerateReleaseKey replaced an existing key")
	}
	if err := os.Chmod(keyPath, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadReleaseKey(keyPath); err == nil {
		t.Error("loaded a key readable by its group")
	}
}

func FuzzVerifyRelease(f *testing.F) {
	k, err := newKey()
	if err != nil {
		f.Fatal(err)
	}
	pin, err := SPKIPin(&k.PublicKey)
	if err != nil {
		f.Fatal(err)
	}
	good, err := SignRelease(testRelease(), []*ecdsa.PrivateKey{k})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"manifest_version":1,"release":{},"signatures":[]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := VerifyRelease(data, ReleasePolicy{Pins: []string{pin}, Threshold: 1, Product: "bcd", Now: releaseNow})
		if err != nil {
			if r != nil {
				t.Fatal("release returned with an error")
			}
			return
		}
		// Anything accepted is well formed and carries its signed body.
		if err := r.Validate(); err != nil {
			t.Fatalf("accepted an invalid release: %v", err)
		}
	})
}
