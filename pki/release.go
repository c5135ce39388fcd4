package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/better-compute/bcd/internal/human"
)

// ManifestFile is the name of the signed manifest inside a release directory.
const ManifestFile = "manifest.json"

// manifestVersion is the manifest.json format; readers refuse any other.
const manifestVersion = 1

// MaxManifestSize bounds manifest.json before it is parsed. A manifest lists a
// dozen artifacts and a few signatures, a few KiB; the JWS limit is the
// ceiling for one signature, so the whole file gets the same.
const MaxManifestSize = MaxJWSSize

// maxArtifacts bounds the artifact list, so a hostile manifest cannot make a
// verifier hash or compare without end.
const maxArtifacts = 1024

// Errors a release verification wraps, one per reason, so that a caller can
// tell them apart with errors.Is and an operator reads the code first. The
// spec names RELEASE_MISMATCH and RELEASE_INCOMPLETE; the other three codes
// are bcd's own names for what self-update step 1 refuses.
var (
	// ErrReleaseMismatch: the manifest is for another product or version.
	ErrReleaseMismatch = errors.New("RELEASE_MISMATCH")
	// ErrReleaseIncomplete: the manifest lacks an artifact the caller needs.
	ErrReleaseIncomplete = errors.New("RELEASE_INCOMPLETE")
	// ErrReleaseUntrusted: fewer distinct pinned keys signed it than the
	// threshold asks, or the manifest is malformed.
	ErrReleaseUntrusted = errors.New("RELEASE_UNTRUSTED")
	// ErrReleaseExpired: the manifest's expiry has passed.
	ErrReleaseExpired = errors.New("RELEASE_EXPIRED")
	// ErrReleaseRollback: the manifest's sequence is below the floor.
	ErrReleaseRollback = errors.New("RELEASE_ROLLBACK")
)

// Release is the signed body of a manifest: what the release is and the
// exact bytes of each of its files.
type Release struct {
	// Product is what was released: "bcd" for the daemon's releases.
	Product string `json:"product"`
	// Version is the release's version, as in its artifact names (0.1.0).
	Version string `json:"version"`
	// Sequence orders releases of the product: a verifier refuses one below
	// the sequence it already runs or was installed at, so an old (signed,
	// vulnerable) release cannot be replayed.
	Sequence int64 `json:"sequence"`
	// Expires is when the signatures stop vouching for the release: a
	// stolen old manifest is worthless after it.
	Expires time.Time `json:"expires"`
	// Artifacts are the release's files, sorted by name.
	Artifacts []Artifact `json:"artifacts"`
}

// Artifact is one file of a release.
type Artifact struct {
	// Name is the file's base name (bcd_0.1.0_linux_amd64).
	Name string `json:"name"`
	// Size is its length in bytes.
	Size int64 `json:"size"`
	// SHA256 is the lowercase hex SHA-256 of its content.
	SHA256 string `json:"sha256"`
}

// ManifestSignature is one key's signature over the release body.
type ManifestSignature struct {
	// KeyPin is the signer's SPKI pin. It is a hint for a reader and for
	// skipping keys a verifier does not pin; the verifier checks it against
	// the key that actually verifies the JWS.
	KeyPin string `json:"key_pin"`
	// JWS is a compact ES256 JWS under purpose release-manifest whose
	// payload is the canonical encoding of the release body.
	JWS string `json:"jws"`
}

// Manifest is manifest.json: the release body in readable form, and the
// signatures over its canonical encoding.
type Manifest struct {
	// ManifestVersion is the file format, 1.
	ManifestVersion int `json:"manifest_version"`
	// Release is what the signatures vouch for.
	Release Release `json:"release"`
	// Signatures are one per signing key.
	Signatures []ManifestSignature `json:"signatures"`
}

var (
	productRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	versionRE  = regexp.MustCompile(`^v?[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]{1,64})?(\+[0-9A-Za-z.-]{1,64})?$`)
	artifactRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,254}$`)
	sha256RE   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// ValidReleaseVersion reports whether v is a version a release may carry: a
// semantic version with an optional leading v, the pattern the downloads
// route and artifact names share.
func ValidReleaseVersion(v string) bool { return versionRE.MatchString(v) }

// SameVersion compares release versions, ignoring one leading "v": a git
// tag v0.1.0 names the release whose artifacts say 0.1.0.
func SameVersion(a, b string) bool {
	return strings.TrimPrefix(a, "v") == strings.TrimPrefix(b, "v")
}

// Validate checks the body's form: what a verifier must be able to rely on
// before it compares anything.
func (r *Release) Validate() error {
	if !productRE.MatchString(r.Product) {
		return fmt.Errorf("release product %q: want [a-z0-9-], at most 63 characters", human.ShortN(r.Product, 80))
	}
	if !versionRE.MatchString(r.Version) {
		return fmt.Errorf("release version %q is not a semantic version", human.ShortN(r.Version, 80))
	}
	if r.Sequence < 1 {
		return fmt.Errorf("release sequence %d: want 1 or more", r.Sequence)
	}
	if r.Expires.IsZero() {
		return errors.New("release has no expiry")
	}
	if len(r.Artifacts) == 0 {
		return errors.New("release lists no artifacts")
	}
	if len(r.Artifacts) > maxArtifacts {
		return fmt.Errorf("release lists %d artifacts, more than %d", len(r.Artifacts), maxArtifacts)
	}
	for i, a := range r.Artifacts {
		if !artifactRE.MatchString(a.Name) || a.Name == ManifestFile {
			return fmt.Errorf("artifact %d: name %q is not a plain file name", i, human.ShortN(a.Name, 80))
		}
		if i > 0 && r.Artifacts[i-1].Name >= a.Name {
			return fmt.Errorf("artifact %q: artifacts must be sorted by name, each once", a.Name)
		}
		if a.Size < 0 {
			return fmt.Errorf("artifact %q: negative size", a.Name)
		}
		if !sha256RE.MatchString(a.SHA256) {
			return fmt.Errorf("artifact %q: sha256 is not 64 lowercase hex digits", a.Name)
		}
	}
	return nil
}

// Canonical is the encoding the signatures cover: compact JSON, members in
// the struct's order, artifacts sorted, the expiry in UTC to the second.
// Signer and verifier both derive it from the parsed body, so a reformatted
// manifest.json (indentation, member order) still verifies, while any change
// of meaning does not.
func (r *Release) Canonical() ([]byte, error) {
	c := *r
	c.Expires = r.Expires.UTC().Truncate(time.Second)
	return json.Marshal(&c)
}

// Artifact returns the artifact called name.
func (r *Release) Artifact(name string) (Artifact, bool) {
	i := sort.Search(len(r.Artifacts), func(i int) bool { return r.Artifacts[i].Name >= name })
	if i < len(r.Artifacts) && r.Artifacts[i].Name == name {
		return r.Artifacts[i], true
	}
	return Artifact{}, false
}

// BinaryName is the name of the bare binary of product for a platform, as
// goreleaser and scripts/release.sh write it: bcd_0.1.0_linux_amd64.
func BinaryName(product, version, goos, goarch string) string {
	return product + "_" + strings.TrimPrefix(version, "v") + "_" + goos + "_" + goarch
}

// ArchiveName is the name of a product's tar.gz archive for a platform.
func ArchiveName(product, version, goos, goarch string) string {
	return BinaryName(product, version, goos, goarch) + ".tar.gz"
}

// ArtifactsOf hashes every regular file directly in dir, except
// manifest.json, into a sorted artifact list. Subdirectories (goreleaser's
// per-build folders) are skipped; anything else that is not a regular file,
// a symlink say, is refused, since its content could change after signing.
func ArtifactsOf(dir string) ([]Artifact, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("release artifacts: %w", err)
	}
	var out []Artifact
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == ManifestFile || e.IsDir():
			continue
		case !e.Type().IsRegular():
			return nil, fmt.Errorf("release artifacts: %s is not a regular file", filepath.Join(dir, name))
		case !artifactRE.MatchString(name):
			return nil, fmt.Errorf("release artifacts: %q is not a plain file name", name)
		}
		a, err := hashFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("release artifacts: %w", err)
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("release artifacts: %s holds no files", dir)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func hashFile(path string) (Artifact, error) {
	f, err := os.Open(path)
	if err != nil {
		return Artifact{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Artifact{}, fmt.Errorf("%s: %w", path, err)
	}
	return Artifact{Name: filepath.Base(path), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// SignRelease signs r with every key and returns manifest.json. Two keys
// with the same public half are refused: they would look like two signers
// and count as one.
func SignRelease(r Release, keys []*ecdsa.PrivateKey) ([]byte, error) {
	r.Expires = r.Expires.UTC().Truncate(time.Second)
	sort.Slice(r.Artifacts, func(i, j int) bool { return r.Artifacts[i].Name < r.Artifacts[j].Name })
	if err := r.Validate(); err != nil {
		return nil, fmt.Errorf("sign release: %w", err)
	}
	if len(keys) == 0 {
		return nil, errors.New("sign release: no signing key")
	}
	body, err := r.Canonical()
	if err != nil {
		return nil, fmt.Errorf("sign release: %w", err)
	}
	m := Manifest{ManifestVersion: manifestVersion, Release: r}
	seen := map[string]bool{}
	for _, k := range keys {
		if k == nil {
			return nil, errors.New("sign release: no private key")
		}
		pin, err := SPKIPin(&k.PublicKey)
		if err != nil {
			return nil, fmt.Errorf("sign release: %w", err)
		}
		if seen[pin] {
			return nil, fmt.Errorf("sign release: key %s given twice", pin)
		}
		seen[pin] = true
		jws, err := Sign(k, PurposeReleaseManifest, body)
		if err != nil {
			return nil, fmt.Errorf("sign release: %w", err)
		}
		m.Signatures = append(m.Signatures, ManifestSignature{KeyPin: pin, JWS: jws})
	}
	out, err := json.MarshalIndent(&m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("sign release: %w", err)
	}
	return append(out, '\n'), nil
}

// ParseManifest decodes manifest.json and checks its form, not its
// signatures: use VerifyRelease for anything that is to be trusted.
func ParseManifest(data []byte) (*Manifest, error) {
	if len(data) > MaxManifestSize {
		return nil, fmt.Errorf("release manifest: %d bytes, over the %d-byte limit", len(data), MaxManifestSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("release manifest: %w", err)
	}
	if dec.More() {
		return nil, errors.New("release manifest: data after the JSON object")
	}
	// The signed body carries whole seconds in UTC; the readable copy is
	// read the same way, so the expiry checked is the one signed.
	m.Release.Expires = m.Release.Expires.UTC().Truncate(time.Second)
	if m.ManifestVersion != manifestVersion {
		return nil, fmt.Errorf("release manifest: manifest_version %d, want %d", m.ManifestVersion, manifestVersion)
	}
	if err := m.Release.Validate(); err != nil {
		return nil, fmt.Errorf("release manifest: %w", err)
	}
	if len(m.Signatures) > maxArtifacts {
		return nil, fmt.Errorf("release manifest: %d signatures", len(m.Signatures))
	}
	return &m, nil
}

// ReleasePolicy is what a verifier requires of a release.
type ReleasePolicy struct {
	// Pins are the SPKI pins of the release signing keys trusted.
	Pins []string
	// Threshold is how many distinct pinned keys must have signed, 1 or
	// more and at most len(Pins).
	Threshold int
	// Product is the product the release must be for; required.
	Product string
	// Version, when not empty, is the version the release must be (a
	// leading v on either side is ignored).
	Version string
	// MinSequence is the floor: a release with a lower sequence is a
	// rollback and refused.
	MinSequence int64
	// Now is the time the expiry is checked against; required, so that a
	// caller with two clocks (host and server) checks both explicitly.
	Now time.Time
}

func (p *ReleasePolicy) validate() (map[string]bool, error) {
	if len(p.Pins) == 0 {
		return nil, errors.New("no release pins")
	}
	pins := make(map[string]bool, len(p.Pins))
	for _, pin := range p.Pins {
		if _, err := ParsePin(pin); err != nil {
			return nil, fmt.Errorf("release pin: %w", err)
		}
		pins[pin] = true
	}
	if p.Threshold < 1 || p.Threshold > len(pins) {
		return nil, fmt.Errorf("release threshold %d: want 1 to %d (the number of distinct pins)", p.Threshold, len(pins))
	}
	if p.Product == "" {
		return nil, errors.New("no product to check the release against")
	}
	if p.Now.IsZero() {
		return nil, errors.New("no time to check the release's expiry against")
	}
	return pins, nil
}

// VerifyRelease verifies manifest.json under policy and returns the release
// it vouches for. At least Threshold distinct pinned keys must have signed
// the canonical body under purpose release-manifest: a key that signed twice
// counts once, a signature by a key that is not pinned is ignored, and a
// signature whose payload is not this body does not count. Then the product,
// version, expiry and sequence floor are checked, in that order. Every
// refusal wraps one of the ErrRelease* errors and says what failed; an
// error about the policy itself (no pins, a threshold above them) wraps
// none, as it is the caller's mistake, not the release's.
func VerifyRelease(data []byte, policy ReleasePolicy) (*Release, error) {
	pins, err := policy.validate()
	if err != nil {
		return nil, fmt.Errorf("verify release: %w", err)
	}
	m, err := ParseManifest(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrReleaseUntrusted, err)
	}
	body, err := m.Release.Canonical()
	if err != nil {
		return nil, fmt.Errorf("%w: release manifest: %w", ErrReleaseUntrusted, err)
	}
	signed := map[string]bool{}
	var refused []string
	for i, s := range m.Signatures {
		if !pins[s.KeyPin] {
			continue
		}
		// VerifyPinned checks that the key in the JWS is the one the pin
		// names before it checks the signature, so key_pin cannot lie.
		payload, _, err := VerifyPinned(s.KeyPin, PurposeReleaseManifest, s.JWS)
		if err != nil {
			refused = append(refused, fmt.Sprintf("signature %d (%s): %v", i, s.KeyPin, err))
			continue
		}
		if !bytes.Equal(payload, body) {
			refused = append(refused, fmt.Sprintf("signature %d (%s): signs another release body", i, s.KeyPin))
			continue
		}
		signed[s.KeyPin] = true
	}
	if len(signed) < policy.Threshold {
		why := ""
		if len(refused) > 0 {
			why = "; refused " + strings.Join(refused, "; ")
		}
		return nil, fmt.Errorf("%w: release manifest is signed by %d distinct pinned key(s), the threshold is %d%s",
			ErrReleaseUntrusted, len(signed), policy.Threshold, why)
	}
	if err := m.Release.Check(policy); err != nil {
		return nil, err
	}
	return &m.Release, nil
}

// Check applies the policy's product, version, expiry and floor to an
// already verified release.
func (r *Release) Check(p ReleasePolicy) error {
	if r.Product != p.Product {
		return fmt.Errorf("%w: release manifest is for product %q, want %q", ErrReleaseMismatch, r.Product, p.Product)
	}
	if p.Version != "" && !SameVersion(r.Version, p.Version) {
		return fmt.Errorf("%w: release manifest is for %s %s, want %s", ErrReleaseMismatch, r.Product, r.Version, p.Version)
	}
	if !p.Now.Before(r.Expires) {
		return fmt.Errorf("%w: release manifest for %s %s expired at %s (now %s)", ErrReleaseExpired, r.Product, r.Version,
			r.Expires.UTC().Format(time.RFC3339), p.Now.UTC().Format(time.RFC3339))
	}
	if r.Sequence < p.MinSequence {
		return fmt.Errorf("%w: release manifest for %s %s has sequence %d, below the floor %d", ErrReleaseRollback, r.Product, r.Version,
			r.Sequence, p.MinSequence)
	}
	return nil
}
