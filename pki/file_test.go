package pki

import (
	"crypto/elliptic"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	old := setUmask(0o077)
	t.Cleanup(func() { setUmask(old) })

	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	tests := []struct {
		data string
		mode os.FileMode
	}{
		{"first", 0o644}, // wider than the umask allows
		{"second, a secret", 0o600},
		{"third", 0o400},
	}
	for _, tt := range tests {
		if err := WriteFileAtomic(path, []byte(tt.data), tt.mode); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tt.data || fi.Mode().Perm() != tt.mode {
			t.Errorf("file = %q %04o, want %q %04o", got, fi.Mode().Perm(), tt.data, tt.mode)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d entries, want 1 (no temporary files left)", len(ents))
	}

	missing := filepath.Join(dir, "no", "such", "f")
	err := WriteFileAtomic(missing, []byte("x"), 0o600)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("err = %v, want one naming %s", err, missing)
	}
	// A directory in the way is not replaced.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(sub, []byte("x"), 0o600); err == nil {
		t.Error("WriteFileAtomic replaced a directory")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("a failed write left %d entries, want 2", len(ents))
	}
}

func TestPKCS8PEM(t *testing.T) {
	k := mustKey(t, elliptic.P256())
	data, err := MarshalPKCS8PEM(k)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParsePKCS8PEM(data)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(k) {
		t.Fatal("round trip changed the key")
	}
	p384, _ := MarshalPKCS8PEM(mustKey(t, elliptic.P384()))
	for name, bad := range map[string][]byte{
		"P-384":        p384,
		"two blocks":   append(append([]byte(nil), data...), data...),
		"wrong type":   []byte(strings.Replace(string(data), "PRIVATE KEY", "EC PRIVATE KEY", 2)),
		"not PEM":      []byte("hello"),
		"trailing":     append(append([]byte(nil), data...), "junk"...),
		"empty":        nil,
		"corrupt body": []byte(strings.Replace(string(data), "\n", "\nAAAA", 2)),
	} {
		if _, err := ParsePKCS8PEM(bad); err == nil {
			t.Errorf("ParsePKCS8PEM accepted %s", name)
		}
	}
}
