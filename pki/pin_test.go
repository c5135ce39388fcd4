package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/internal/testenv"
)

func TestParsePin(t *testing.T) {
	sum := sha256.Sum256([]byte("bcd"))
	good := base64.StdEncoding.EncodeToString(sum[:])
	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xfb}, n)) }
	tests := []struct {
		name string
		pin  string
		ok   bool
	}{
		{"good", "sha256/" + good, true},
		{"good with + and /", "sha256/" + b64(32), true},
		{"missing prefix", good, false},
		{"other hash", "sha384/" + good, false},
		{"upper-case prefix", "SHA256/" + good, false},
		{"empty", "", false},
		{"prefix only", "sha256/", false},
		{"bad base64", "sha256/" + strings.Repeat("!", 44), false},
		{"31 bytes", "sha256/" + b64(31), false},
		{"33 bytes", "sha256/" + b64(33), false},
		{"url-safe alphabet", "sha256/" + strings.NewReplacer("+", "-", "/", "_").Replace(b64(32)), false},
		{"no padding", "sha256/" + strings.TrimRight(b64(32), "="), false},
		{"non-zero padding bits", "sha256/" + b64(32)[:42] + "/=", false},
		{"leading space", " sha256/" + good, false},
		{"trailing newline", "sha256/" + good + "\n", false},
		{"inner newline", "sha256/" + good[:20] + "\n" + good[20:], false},
		{"inner CR", "sha256/" + good[:20] + "\r" + good[20:], false},
		{"trailing space", "sha256/" + good + " ", false},
		{"tab after prefix", "sha256/\t" + good, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePin(tt.pin)
			if (err == nil) != tt.ok {
				t.Fatalf("ParsePin(%q) err = %v, want ok=%v", tt.pin, err, tt.ok)
			}
			if tt.ok && "sha256/"+base64.StdEncoding.EncodeToString(got[:]) != tt.pin {
				t.Errorf("ParsePin(%q) = %x, which does not re-encode to the pin", tt.pin, got)
			}
		})
	}
}

func TestMatchPin(t *testing.T) {
	k1, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	k2, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pin, err := SPKIPin(&k1.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := MatchPin(pin, &k1.PublicKey); err != nil {
		t.Errorf("own key: %v", err)
	}
	if err := MatchPin(pin, &k2.PublicKey); !errors.Is(err, ErrPinMismatch) {
		t.Errorf("other key: err = %v, want ErrPinMismatch", err)
	}
	if err := MatchPin("sha256/nope", &k1.PublicKey); err == nil || errors.Is(err, ErrPinMismatch) {
		t.Errorf("malformed pin: err = %v, want a parse error", err)
	}
}

// TestPinsMatchOpenSSL checks every pin of a fresh bundle against what an
// operator would compute by hand:
//
//	openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64
//
// The public keys are extracted by openssl itself, from the private key files
// and the certificates, so the check does not trust this package's encoding.
func TestPinsMatchOpenSSL(t *testing.T) {
	testenv.NeedTool(t, "openssl")
	testenv.NeedTool(t, "base64")
	b := newTestBundle(t)
	p := b.Public
	tmp := t.TempDir()

	tests := []struct {
		name    string
		keyFile string // private key in the bundle
		crtFile string // certificate holding the same key, if any
		pin     string
		pubPEM  string // public PEM from public.json, if any
	}{
		{"serving CA", ServingCAKeyFile, ServingCACertFile, p.ServingCASPKIPin, ""},
		{"join signing", JoinSigningKeyFile, "", p.JoinSigningKeyPin, p.JoinSigningPublicPEM},
		{"join encryption", JoinEncryptionKeyFile, "", p.JoinEncryptionKeyPin, ""},
		{"node CA", NodeCAKeyFile, NodeCACertFile, CertPin(p.NodeCA()), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pubPEM := run(t, nil, "openssl", "pkey", "-in", filepath.Join(b.Dir, tt.keyFile), "-pubout")
			path := filepath.Join(tmp, tt.keyFile+".pub")
			if err := os.WriteFile(path, pubPEM, 0o644); err != nil {
				t.Fatal(err)
			}
			if got := opensslPin(t, path); got != tt.pin {
				t.Errorf("openssl pin %q, bundle pin %q", got, tt.pin)
			}
			if tt.pubPEM != "" && tt.pubPEM != string(pubPEM) {
				t.Errorf("public.json PEM differs from openssl's:\n%s\nvs\n%s", tt.pubPEM, pubPEM)
			}
			if tt.crtFile != "" {
				certPub := run(t, nil, "openssl", "x509", "-in", filepath.Join(b.Dir, tt.crtFile), "-pubkey", "-noout")
				if !bytes.Equal(certPub, pubPEM) {
					t.Errorf("%s holds another key than %s", tt.crtFile, tt.keyFile)
				}
			}
		})
	}
	t.Run("JWK", func(t *testing.T) {
		// The JWK file must hash to its pin too, through SPKIPin.
		data, err := os.ReadFile(filepath.Join(b.Dir, JoinEncryptionJWKFile))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := JWKMatchesPin(data, p.JoinEncryptionKeyPin); err != nil {
			t.Error(err)
		}
	})
}

// opensslPin runs the pipeline of the spec on a PEM public key file.
func opensslPin(t *testing.T, pubPEMPath string) string {
	t.Helper()
	der := run(t, nil, "openssl", "pkey", "-pubin", "-in", pubPEMPath, "-outform", "der")
	digest := run(t, der, "openssl", "dgst", "-sha256", "-binary")
	b64 := run(t, digest, "base64")
	return PinPrefix + strings.TrimSuffix(string(b64), "\n")
}

func run(t *testing.T, stdin []byte, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

func pinOfDigest(b [32]byte) string { return PinPrefix + base64.StdEncoding.EncodeToString(b[:]) }
