package pki

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var wantModes = map[string]os.FileMode{
	ServingCAKeyFile:      0o600,
	ServingCACertFile:     0o644,
	JoinSigningKeyFile:    0o600,
	JoinEncryptionKeyFile: 0o600,
	JoinEncryptionJWKFile: 0o644,
	NodeCAKeyFile:         0o600,
	NodeCACertFile:        0o644,
	PublicFile:            0o644,
	SecretsKeyFile:        0o600,
}

// newTestBundle makes a bundle in a fresh directory and loads it.
func newTestBundle(t testing.TB) *Bundle {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := Init(dir, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := LoadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// snapshot maps each file name in dir to its content and mode.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fi.Mode().String() + "\n" + string(data)
	}
	return out
}

func TestInitLayout(t *testing.T) {
	// A permissive umask must not widen any mode.
	old := setUmask(0)
	t.Cleanup(func() { setUmask(old) })

	dir := filepath.Join(t.TempDir(), "pki")
	pub, err := Init(dir, InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o700 {
		t.Errorf("dir mode = %04o, want 0700", got)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]os.FileMode{}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if !fi.Mode().IsRegular() {
			t.Errorf("%s is %v, want a regular file", e.Name(), fi.Mode())
		}
		got[e.Name()] = fi.Mode().Perm()
	}
	if diff := cmp.Diff(wantModes, got); diff != "" {
		t.Errorf("files and modes (-want +got):\n%s", diff)
	}
	// No temporary sibling is left beside the bundle.
	if ents, _ := os.ReadDir(filepath.Dir(dir)); len(ents) != 1 {
		t.Errorf("parent holds %d entries, want only the bundle", len(ents))
	}

	if pub.TrustDomain != DefaultTrustDomain {
		t.Errorf("trust domain = %q, want %q", pub.TrustDomain, DefaultTrustDomain)
	}
	loaded, err := LoadPublic(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pub, loaded, cmpopts.IgnoreUnexported(Public{})); diff != "" {
		t.Errorf("LoadPublic differs from what Init returned (-init +load):\n%s", diff)
	}
	if err := loaded.Pins().Validate(); err != nil {
		t.Error(err)
	}

	b, err := LoadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, ok := range map[string]bool{
		"serving CA": b.ServingCAKey.PublicKey.Equal(b.Public.ServingCA().PublicKey),
		"node CA":    b.NodeCAKey.PublicKey.Equal(b.Public.NodeCA().PublicKey),
		"signing":    b.JoinSigningKey.PublicKey.Equal(b.Public.JoinSigningPublicKey()),
		"encryption": b.JoinEncryptionKey.PublicKey.Equal(b.Public.JoinEncryptionPublicKey()),
	} {
		if !ok {
			t.Errorf("%s key does not match its public half", name)
		}
	}
	if sc, nc := b.Public.ServingCA(), b.Public.NodeCA(); sc.Equal(nc) || !sc.IsCA || !nc.IsCA {
		t.Error("serving and node CA must be two distinct CA certificates")
	}
	if got := b.Public.NodeCA().PermittedURIDomains; !cmp.Equal(got, []string{DefaultTrustDomain}) {
		t.Errorf("node CA permitted URI domains = %q", got)
	}
	if years := b.Public.ServingCA().NotAfter.Sub(b.Public.ServingCA().NotBefore).Hours() / 24 / 365; years < 9.99 || years > 10.01 {
		t.Errorf("serving CA valid for %.2f years, want 10", years)
	}
}

func TestInitTrustDomain(t *testing.T) {
	tests := []struct {
		td      string
		wantErr bool
	}{
		{"", false}, // default
		{"example.com", false},
		{"fsn1.fleet.example-corp.net", false},
		{"localdomain", false},
		{"Example.com", true},
		{"-bad.example", true},
		{"bad-.example", true},
		{"a..b", true},
		{".example", true},
		{"example.", true},
		{"under_score.example", true},
		{"spaces in.example", true},
		{"evil.example/x", true},
		{"evil.example:443", true},
		{strings.Repeat("a", 64) + ".example", true},
	}
	for _, tt := range tests {
		t.Run(tt.td, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "pki")
			pub, err := Init(dir, InitOptions{TrustDomain: tt.td})
			if tt.wantErr {
				if err == nil {
					t.Fatalf("Init(%q) succeeded, want an error", tt.td)
				}
				if ok, _ := exists(dir); ok {
					t.Errorf("refused Init left %s behind", dir)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := tt.td
			if want == "" {
				want = DefaultTrustDomain
			}
			if pub.TrustDomain != want {
				t.Errorf("trust domain %q, want %q", pub.TrustDomain, want)
			}
		})
	}
}

func TestInitRefusesExisting(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := Init(dir, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, dir)
	_, err := Init(dir, InitOptions{})
	if !errors.Is(err, ErrBundleExists) {
		t.Fatalf("second Init: err = %v, want ErrBundleExists", err)
	}
	if !strings.Contains(err.Error(), dir) {
		t.Errorf("error %q does not name %s", err, dir)
	}
	if diff := cmp.Diff(before, snapshot(t, dir)); diff != "" {
		t.Errorf("second Init changed the first bundle (-before +after):\n%s", diff)
	}

	// Anything in the directory, not only a bundle, is refused.
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "notes.txt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(other, InitOptions{}); !errors.Is(err, ErrBundleExists) {
		t.Errorf("Init on a non-empty dir: err = %v, want ErrBundleExists", err)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(file, InitOptions{}); !errors.Is(err, ErrBundleExists) {
		t.Errorf("Init on a file: err = %v, want ErrBundleExists", err)
	}
	dangling := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(filepath.Join(t.TempDir(), "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(dangling, InitOptions{}); !errors.Is(err, ErrBundleExists) {
		t.Errorf("Init on a dangling symlink: err = %v, want ErrBundleExists", err)
	}
}

func TestInitIntoEmptyDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Init(dir, InitOptions{}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o700 {
		t.Errorf("dir mode = %04o, want 0700", got)
	}
	if _, err := LoadBundle(dir); err != nil {
		t.Fatal(err)
	}
}

func TestInitFailureLeavesNothing(t *testing.T) {
	for _, failAt := range []string{ServingCACertFile, JoinSigningKeyFile, PublicFile} {
		t.Run("new dir/"+failAt, func(t *testing.T) {
			failWritingAt(t, failAt)
			parent := t.TempDir()
			dir := filepath.Join(parent, "pki")
			if _, err := Init(dir, InitOptions{}); err == nil {
				t.Fatal("Init succeeded, want the injected failure")
			}
			ents, err := os.ReadDir(parent)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				t.Errorf("failed Init left %s", e.Name())
			}
		})
		t.Run("empty dir/"+failAt, func(t *testing.T) {
			failWritingAt(t, failAt)
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o750); err != nil {
				t.Fatal(err)
			}
			if _, err := Init(dir, InitOptions{}); err == nil {
				t.Fatal("Init succeeded, want the injected failure")
			}
			if got := snapshot(t, dir); len(got) != 0 {
				t.Errorf("failed Init left %v", cmp.Diff(map[string]string{}, got))
			}
			if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o750 {
				t.Errorf("dir mode not restored: %v, %v", fi.Mode(), err)
			}
			// The directory is usable again.
			testHookWrite = nil
			if _, err := Init(dir, InitOptions{}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func failWritingAt(t *testing.T, name string) {
	t.Helper()
	testHookWrite = func(n string) error {
		if n == name {
			return errors.New("injected failure")
		}
		return nil
	}
	t.Cleanup(func() { testHookWrite = nil })
}

func TestLoadBundleRefusesReadableKey(t *testing.T) {
	for _, name := range []string{ServingCAKeyFile, JoinSigningKeyFile, JoinEncryptionKeyFile, NodeCAKeyFile} {
		for _, mode := range []os.FileMode{0o640, 0o604, 0o660, 0o602} {
			t.Run(name+"/"+mode.String(), func(t *testing.T) {
				b := newTestBundle(t)
				path := filepath.Join(b.Dir, name)
				if err := os.Chmod(path, mode); err != nil {
					t.Fatal(err)
				}
				_, err := LoadBundle(b.Dir)
				if err == nil {
					t.Fatalf("LoadBundle accepted %s with mode %04o", name, mode)
				}
				if !strings.Contains(err.Error(), path) {
					t.Errorf("error %q does not name %s", err, path)
				}
				// The public half stays usable without the keys.
				if _, err := LoadPublic(b.Dir); err != nil {
					t.Errorf("LoadPublic: %v", err)
				}
			})
		}
	}
	t.Run("0400 is fine", func(t *testing.T) {
		b := newTestBundle(t)
		if err := os.Chmod(filepath.Join(b.Dir, JoinSigningKeyFile), 0o400); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadBundle(b.Dir); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLoadPublicNeedsOnlyPublicJSON(t *testing.T) {
	b := newTestBundle(t)
	only := t.TempDir()
	data, err := os.ReadFile(filepath.Join(b.Dir, PublicFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(only, PublicFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	pins, err := BootstrapPins(only)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(b.Public.Pins(), pins); diff != "" {
		t.Errorf("BootstrapPins (-want +got):\n%s", diff)
	}
	if _, err := LoadBundle(only); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("LoadBundle without keys: err = %v, want not-exist", err)
	}
}

// TestLoadBundleMismatch swaps one file for the same file of another bundle:
// every swap must be caught and named.
func TestLoadBundleMismatch(t *testing.T) {
	other := newTestBundle(t)
	for name := range wantModes {
		if name == SecretsKeyFile {
			// The keyring is not bound to the bundle's keys: LoadBundle does
			// not read it, and the store refuses what it does not open.
			continue
		}
		t.Run(name, func(t *testing.T) {
			a := newTestBundle(t)
			data, err := os.ReadFile(filepath.Join(other.Dir, name))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(a.Dir, name)
			if err := WriteFileAtomic(path, data, wantModes[name]); err != nil {
				t.Fatal(err)
			}
			_, err = LoadBundle(a.Dir)
			if err == nil {
				t.Fatalf("LoadBundle accepted %s from another bundle", name)
			}
			// A swapped public.json is detected through the keys that no
			// longer match it; the error then names a key file.
			if name != PublicFile && !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name %s", err, path)
			}
		})
	}
}

func TestLoadPublicRefusesInconsistent(t *testing.T) {
	b := newTestBundle(t)
	other := newTestBundle(t)
	tests := []struct {
		name   string
		mutate func(p *Public)
	}{
		{"wrong serving pin", func(p *Public) { p.ServingCASPKIPin = other.Public.ServingCASPKIPin }},
		{"wrong signing pin", func(p *Public) { p.JoinSigningKeyPin = other.Public.JoinSigningKeyPin }},
		{"wrong encryption pin", func(p *Public) { p.JoinEncryptionKeyPin = other.Public.JoinEncryptionKeyPin }},
		{"other JWK", func(p *Public) { p.JoinEncryptionJWK = other.Public.JoinEncryptionJWK }},
		{"bad trust domain", func(p *Public) { p.TrustDomain = "Not Valid" }},
		{"version", func(p *Public) { p.Version = 2 }},
		{"leaf as CA", func(p *Public) {
			c, err := b.IssueServingCert([]string{"x.example"}, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			p.NodeCAPEM = string(certPEM(c.Certificate[0]))
		}},
		{"two certs", func(p *Public) { p.ServingCAPEM += other.Public.ServingCAPEM }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := *b.Public
			tt.mutate(&p)
			data, err := jsonMarshal(&p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := parsePublic(data); err == nil {
				t.Error("parsePublic accepted an inconsistent public.json")
			}
		})
	}
	t.Run("unknown field", func(t *testing.T) {
		data, _ := jsonMarshal(b.Public)
		data = []byte(strings.Replace(string(data), "{", `{"extra":1,`, 1))
		if _, err := parsePublic(data); err == nil {
			t.Error("parsePublic accepted an unknown field")
		}
	})
}

func TestConfigLines(t *testing.T) {
	p := Pins{
		ServingCA:      "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
		JoinSigning:    "sha256/BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBA=",
		JoinEncryption: "sha256/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/8=",
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	want := `serving_ca_spki_pin = "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
join_signing_key_pin = "sha256/BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBA="
join_encryption_key_pin = "sha256/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/+/8="
`
	if diff := cmp.Diff(want, p.ConfigLines()); diff != "" {
		t.Errorf("ConfigLines (-want +got):\n%s", diff)
	}
	bad := p
	bad.JoinEncryption = "sha256/short"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "join_encryption_key_pin") {
		t.Errorf("Validate: err = %v, want one naming join_encryption_key_pin", err)
	}
}

func jsonMarshal(p *Public) ([]byte, error) { return json.Marshal(p) }
