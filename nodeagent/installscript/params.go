package installscript

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// InputError is a value the generator refuses to embed. Its text starts with
// INVALID_INPUT and names the flag, so an operator sees which one to fix; the
// CLI exits 2 for it, as for any usage error.
type InputError struct {
	// Flag is the command-line flag at fault, with its dashes (--site), or
	// two flags that do not go together.
	Flag string
	// Msg says what is wrong, quoting the value only when it is not secret
	// (no flag of this command takes a secret).
	Msg string
}

func (e *InputError) Error() string {
	return protocol.CodeInvalidInput + ": " + e.Flag + ": " + e.Msg
}

func invalid(flag, format string, args ...any) error {
	return &InputError{Flag: flag, Msg: fmt.Sprintf(format, args...)}
}

// The platforms a script can pin; uname -m maps onto them.
var arches = []string{"amd64", "arm64"}

// Plugins a release ships, which --install-plugins may name.
var releasePlugins = map[string]bool{"bcx-ipmi": true}

// The narrow patterns. Each keeps to characters that mean nothing to sh
// inside single quotes or to TOML inside a basic string, so a value can
// never end the quoting it is embedded in.
var (
	idRE      = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)
	hostRE    = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]{2,45}\])$`)
	segmentRE = regexp.MustCompile(`^[A-Za-z0-9._~-]{1,64}$`)
	hexRE     = regexp.MustCompile(`^[0-9a-f]{64}$`)
	pinRE     = regexp.MustCompile(`^sha256/[A-Za-z0-9+/]{43}=$`)
	nameRE    = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
	bridgeRE  = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
	jwkRE     = regexp.MustCompile(`^\{[A-Za-z0-9_":,/+=.{}-]{1,1000}\}$`)
)

// Request is the command line of `better-compute daemon install-script`,
// one field per flag, as given. Build reads the files it names and checks
// every value.
type Request struct {
	Pool             string // --pool
	Site             string // --site
	GatewayURL       string // --gateway-url
	BaseURL          string // --base-url
	BCDVersion       string // --bcd-version
	SHA256           string // --sha256 amd64=<hex>,arm64=<hex>
	ReleaseManifest  string // --release-manifest FILE
	ReleasePins      string // --release-pins P1,P2
	ReleaseThreshold int    // --release-threshold, when ThresholdGiven (else 1)
	ThresholdGiven   bool   // --release-threshold was on the command line
	Attestor         string // --attestor
	Plugins          bool   // --plugins
	PluginsPriv      string // --privileged-plugins NAMES
	InstallPlugins   string // --install-plugins NAMES
	Unprivileged     bool   // --unprivileged
	InstanceBridges  string // --instance-bridges NAMES
	ProxyCAFile      string // --proxy-ca-file FILE
	PKIDir           string // --pki DIR
	// Now is the time a release manifest's expiry is checked against.
	Now time.Time
}

// Params is everything a script embeds, checked.
type Params struct {
	// Pool and Site name where the node joins; the pool appears only in
	// the header, the site is config.toml's site.
	Pool, Site string
	// GatewayURL is config.toml's gateway_url.
	GatewayURL string
	// DownloadsURL is {base-url}{base-path}/downloads, without a trailing
	// slash.
	DownloadsURL string
	// Version is the bcd release to install.
	Version string
	// SHA256 maps an architecture (amd64, arm64) to the pinned digest of
	// the bare bcd binary; at least one.
	SHA256 map[string]string
	// TPM joins with the TPM attestor instead of a token.
	TPM bool
	// Plugins makes a plugin node; Privileged are the names written to
	// [plugins] privileged.
	Plugins    bool
	Privileged []string
	// Install are the release plugins to install, by name.
	Install []Plugin
	// Unprivileged adds [helper]; InstanceBridges go into it.
	Unprivileged    bool
	InstanceBridges []string
	// ProxyCAPEM is written to /etc/bcd/websocket-proxy-ca.pem when set.
	ProxyCAPEM string
	// Pins are config.toml's three pins.
	Pins pki.Pins
	// JoinEncryptionJWK is join-encryption.jwk.
	JoinEncryptionJWK string
	// Update, when set, is written as [update] (a manifest was given).
	Update *Update
}

// Plugin is a release plugin the script installs.
type Plugin struct {
	// Name is the plugin and its binary's name in the archive.
	Name string
	// SHA256 maps an architecture to the digest of its tar.gz archive.
	SHA256 map[string]string
}

// Update is what the script writes to config.toml's [update] section so
// that the node's self-update trusts the same release keys the install did.
type Update struct {
	// ReleasePins are [update] release_pins.
	ReleasePins []string
	// ReleaseThreshold is [update] release_threshold.
	ReleaseThreshold int
	// ReleaseSequence is [update] release_sequence: the installed
	// release's sequence, the node's rollback floor.
	ReleaseSequence int64
}

// Build turns a command line into a script: it checks every flag, reads the
// public half of the PKI bundle, verifies the release manifest when there is
// one, and renders the script.
func Build(r Request) ([]byte, error) {
	p, err := r.Params()
	if err != nil {
		return nil, err
	}
	return Generate(p)
}

// Params checks the request and reads the files it names.
func (r Request) Params() (*Params, error) {
	p := &Params{
		Pool: r.Pool, Site: r.Site, GatewayURL: r.GatewayURL, Version: r.BCDVersion,
		Plugins: r.Plugins, Unprivileged: r.Unprivileged,
	}
	for _, req := range []struct{ flag, value string }{
		{"--pool", r.Pool}, {"--site", r.Site}, {"--gateway-url", r.GatewayURL},
		{"--base-url", r.BaseURL}, {"--bcd-version", r.BCDVersion}, {"--pki", r.PKIDir},
	} {
		if req.value == "" {
			return nil, invalid(req.flag, "is required")
		}
	}
	if err := checkID("--pool", r.Pool); err != nil {
		return nil, err
	}
	if err := checkID("--site", r.Site); err != nil {
		return nil, err
	}
	if _, err := checkHTTPS("--gateway-url", r.GatewayURL); err != nil {
		return nil, err
	}
	base, err := checkHTTPS("--base-url", r.BaseURL)
	if err != nil {
		return nil, err
	}
	p.DownloadsURL = base + "/downloads"
	if !pki.ValidReleaseVersion(r.BCDVersion) || len(r.BCDVersion) > 64 {
		return nil, invalid("--bcd-version", "%q is not a semantic version (0.1.0, v0.1.0, 0.1.0-rc.1)", r.BCDVersion)
	}
	switch r.Attestor {
	case "", "join-token":
	case "tpm":
		p.TPM = true
	default:
		return nil, invalid("--attestor", "%q: want tpm (or join-token, the default)", r.Attestor)
	}
	if p.Privileged, err = names("--privileged-plugins", r.PluginsPriv, nameRE); err != nil {
		return nil, err
	}
	install, err := names("--install-plugins", r.InstallPlugins, nameRE)
	if err != nil {
		return nil, err
	}
	for _, n := range install {
		if !releasePlugins[n] {
			return nil, invalid("--install-plugins", "%q is not a plugin a release ships (only bcx-ipmi)", n)
		}
	}
	if p.InstanceBridges, err = names("--instance-bridges", r.InstanceBridges, bridgeRE); err != nil {
		return nil, err
	}
	if len(p.Privileged) > 0 || len(install) > 0 {
		p.Plugins = true
	}
	if r.Unprivileged {
		switch {
		case r.Plugins:
			return nil, invalid("--plugins", "cannot be combined with --unprivileged")
		case len(p.Privileged) > 0:
			return nil, invalid("--privileged-plugins", "cannot be combined with --unprivileged")
		case len(install) > 0:
			return nil, invalid("--install-plugins", "cannot be combined with --unprivileged")
		}
	} else if len(p.InstanceBridges) > 0 {
		return nil, invalid("--instance-bridges", "only goes with --unprivileged (the bridges are [helper] instance_bridges)")
	}

	switch {
	case r.SHA256 != "" && r.ReleaseManifest != "":
		return nil, invalid("--sha256", "give exactly one of --sha256 and --release-manifest, not both")
	case r.SHA256 == "" && r.ReleaseManifest == "":
		return nil, invalid("--sha256", "give exactly one of --sha256 and --release-manifest")
	case r.SHA256 != "":
		if r.ReleasePins != "" {
			return nil, invalid("--release-pins", "only goes with --release-manifest")
		}
		if r.ThresholdGiven {
			return nil, invalid("--release-threshold", "only goes with --release-manifest")
		}
		if len(install) > 0 {
			return nil, invalid("--install-plugins", "needs --release-manifest: the archives' digests come from the signed manifest")
		}
		if p.SHA256, err = parseSHA256(r.SHA256); err != nil {
			return nil, err
		}
	default:
		if err := p.fromManifest(r, install); err != nil {
			return nil, err
		}
	}

	if r.ProxyCAFile != "" {
		if p.ProxyCAPEM, err = readProxyCA(r.ProxyCAFile); err != nil {
			return nil, err
		}
	}
	// Only the public half: the generator never opens a private key.
	pub, err := pki.LoadPublic(r.PKIDir)
	if err != nil {
		return nil, invalid("--pki", "%v", err)
	}
	p.Pins = pub.Pins()
	jwk, err := pki.PublicJWK(pub.JoinEncryptionPublicKey())
	if err != nil {
		return nil, invalid("--pki", "join encryption key: %v", err)
	}
	p.JoinEncryptionJWK = string(jwk)
	return p, nil
}

// fromManifest verifies the manifest and takes the digests from it.
func (p *Params) fromManifest(r Request, install []string) error {
	if r.ReleasePins == "" {
		return invalid("--release-pins", "is required with --release-manifest")
	}
	pins, err := names("--release-pins", r.ReleasePins, pinRE)
	if err != nil {
		return err
	}
	for _, pin := range pins {
		if _, err := pki.ParsePin(pin); err != nil {
			return invalid("--release-pins", "%v", err)
		}
	}
	threshold := 1
	if r.ThresholdGiven {
		threshold = r.ReleaseThreshold
	}
	if threshold < 1 || threshold > len(pins) {
		return invalid("--release-threshold", "%d: want 1 to %d (the number of --release-pins)", r.ReleaseThreshold, len(pins))
	}
	data, err := readSmall(r.ReleaseManifest, pki.MaxManifestSize)
	if err != nil {
		return invalid("--release-manifest", "%v", err)
	}
	now := r.Now
	if now.IsZero() {
		now = time.Now()
	}
	rel, err := pki.VerifyRelease(data, pki.ReleasePolicy{
		Pins: pins, Threshold: threshold, Product: "bcd", Version: r.BCDVersion, Now: now,
	})
	if err != nil {
		return fmt.Errorf("--release-manifest %s: %w", r.ReleaseManifest, err)
	}
	p.SHA256 = map[string]string{}
	for _, arch := range arches {
		// Only the bare binary: archives, checksums and metadata are
		// what a human downloads, not what the script runs.
		if a, ok := rel.Artifact(pki.BinaryName("bcd", rel.Version, "linux", arch)); ok {
			p.SHA256[arch] = a.SHA256
		}
	}
	if len(p.SHA256) == 0 {
		return fmt.Errorf("%w: --release-manifest %s lists no bare bcd binary (%s or %s)", pki.ErrReleaseIncomplete, r.ReleaseManifest,
			pki.BinaryName("bcd", rel.Version, "linux", "amd64"), pki.BinaryName("bcd", rel.Version, "linux", "arm64"))
	}
	for _, name := range install {
		pl := Plugin{Name: name, SHA256: map[string]string{}}
		for _, arch := range arches {
			if a, ok := rel.Artifact(pki.ArchiveName(name, rel.Version, "linux", arch)); ok {
				pl.SHA256[arch] = a.SHA256
			}
		}
		if len(pl.SHA256) == 0 {
			return fmt.Errorf("%w: --release-manifest %s lists neither %s nor %s", pki.ErrReleaseIncomplete, r.ReleaseManifest,
				pki.ArchiveName(name, rel.Version, "linux", "amd64"), pki.ArchiveName(name, rel.Version, "linux", "arm64"))
		}
		p.Install = append(p.Install, pl)
	}
	p.Update = &Update{ReleasePins: pins, ReleaseThreshold: threshold, ReleaseSequence: rel.Sequence}
	return nil
}

func checkID(flag, v string) error {
	if !idRE.MatchString(v) {
		return invalid(flag, "%q: want letters, digits, _, . and - (at most 63, starting with a letter or digit)", v)
	}
	return nil
}

// checkHTTPS accepts https://host[:port][/path] and returns it without a
// trailing slash. The parsed URL is rebuilt and compared, so nothing the
// URL parser would quietly normalise (escapes, dot segments) gets through.
func checkHTTPS(flag, v string) (string, error) {
	bad := func(why string) error {
		return invalid(flag, "%q: %s (want https://host[:port][/path], letters, digits and ._~- in the path)", v, why)
	}
	u, err := url.Parse(v)
	if err != nil {
		return "", bad("not a URL")
	}
	switch {
	case u.Scheme != "https":
		return "", bad("not https://")
	case u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.RawFragment != "" || u.ForceQuery:
		return "", bad("no user, query or fragment allowed")
	case !hostRE.MatchString(u.Hostname()) && !hostRE.MatchString("["+u.Hostname()+"]"):
		return "", bad("bad host")
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return "", bad("bad port")
		}
	}
	if strings.HasSuffix(u.Host, ":") {
		return "", bad("empty port")
	}
	path := strings.TrimSuffix(u.Path, "/")
	if path != "" {
		for _, seg := range strings.Split(path[1:], "/") {
			if !segmentRE.MatchString(seg) || seg == "." || seg == ".." {
				return "", bad("bad path")
			}
		}
	}
	out := "https://" + u.Host + path
	if out != strings.TrimSuffix(v, "/") {
		return "", bad("not in plain form")
	}
	return out, nil
}

// names splits a comma-separated list, checking each item against re and
// refusing an empty item, a repeat, "." and "..".
func names(flag, v string, re *regexp.Regexp) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var out []string
	seen := map[string]bool{}
	for _, n := range strings.Split(v, ",") {
		switch {
		case !re.MatchString(n) || n == "." || n == "..":
			return nil, invalid(flag, "%q is not a valid name (want %s, comma-separated)", n, describe(re))
		case seen[n]:
			return nil, invalid(flag, "%q is given twice", n)
		}
		seen[n] = true
		out = append(out, n)
	}
	return out, nil
}

func describe(re *regexp.Regexp) string {
	switch re {
	case pinRE:
		return "sha256/ and 44 characters of standard base64"
	case bridgeRE:
		return "1 to 15 letters, digits, _, . and -"
	}
	return "letters, digits, ., _ and -"
}

// parseSHA256 reads amd64=<hex>,arm64=<hex>; either arch may be left out,
// and the script then refuses to run on it.
func parseSHA256(v string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(v, ",") {
		arch, sum, ok := strings.Cut(item, "=")
		if !ok || (arch != "amd64" && arch != "arm64") {
			return nil, invalid("--sha256", "%q: want amd64=<hex>,arm64=<hex>", item)
		}
		if _, dup := out[arch]; dup {
			return nil, invalid("--sha256", "%s is given twice", arch)
		}
		sum = strings.ToLower(sum)
		if !hexRE.MatchString(sum) {
			return nil, invalid("--sha256", "%s: %q is not 64 hexadecimal digits", arch, sum)
		}
		out[arch] = sum
	}
	return out, nil
}

// readProxyCA reads the proxy's CA certificates and re-encodes them, so the
// script embeds only base64 and PEM armour, whatever else the file held.
func readProxyCA(path string) (string, error) {
	data, err := readSmall(path, 256<<10)
	if err != nil {
		return "", invalid("--proxy-ca-file", "%v", err)
	}
	var out strings.Builder
	for n := 0; ; n++ {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			if n == 0 {
				return "", invalid("--proxy-ca-file", "%s holds no PEM certificate", path)
			}
			if strings.TrimSpace(string(data)) != "" {
				return "", invalid("--proxy-ca-file", "%s: data after the last PEM certificate", path)
			}
			return out.String(), nil
		}
		if b.Type != "CERTIFICATE" {
			return "", invalid("--proxy-ca-file", "%s: PEM block %d is not a CERTIFICATE", path, n+1)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return "", invalid("--proxy-ca-file", "%s: certificate %d: %v", path, n+1, err)
		}
		out.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.Bytes}))
	}
}

func readSmall(path string, limit int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return os.ReadFile(path)
}

// check validates Params that did not come from Request (a caller building
// them by hand) with the same patterns, so Generate never embeds a value
// the patterns would refuse.
func (p *Params) check() error {
	if err := checkID("--pool", p.Pool); err != nil {
		return err
	}
	if err := checkID("--site", p.Site); err != nil {
		return err
	}
	if _, err := checkHTTPS("--gateway-url", p.GatewayURL); err != nil {
		return err
	}
	if d, ok := strings.CutSuffix(p.DownloadsURL, "/downloads"); !ok {
		return invalid("--base-url", "downloads URL %q does not end in /downloads", p.DownloadsURL)
	} else if _, err := checkHTTPS("--base-url", d); err != nil {
		return err
	}
	if !pki.ValidReleaseVersion(p.Version) || len(p.Version) > 64 {
		return invalid("--bcd-version", "%q is not a semantic version", p.Version)
	}
	if err := checkDigests("--sha256", p.SHA256); err != nil {
		return err
	}
	if len(p.SHA256) == 0 {
		return invalid("--sha256", "no architecture is pinned")
	}
	for _, n := range p.Privileged {
		if !nameRE.MatchString(n) || n == "." || n == ".." {
			return invalid("--privileged-plugins", "%q is not a valid name", n)
		}
	}
	for _, pl := range p.Install {
		if !releasePlugins[pl.Name] {
			return invalid("--install-plugins", "%q is not a plugin a release ships", pl.Name)
		}
		if err := checkDigests("--release-manifest", pl.SHA256); err != nil {
			return err
		}
	}
	for _, b := range p.InstanceBridges {
		if !bridgeRE.MatchString(b) || b == "." || b == ".." {
			return invalid("--instance-bridges", "%q is not a valid name", b)
		}
	}
	if p.Unprivileged && (p.Plugins || len(p.Install) > 0 || len(p.Privileged) > 0) {
		return invalid("--plugins", "cannot be combined with --unprivileged")
	}
	for _, pin := range []string{p.Pins.ServingCA, p.Pins.JoinSigning, p.Pins.JoinEncryption} {
		if !pinRE.MatchString(pin) {
			return invalid("--pki", "pin %q is not sha256/<base64>", pin)
		}
	}
	if !jwkRE.MatchString(p.JoinEncryptionJWK) {
		return invalid("--pki", "join encryption JWK is not in the expected form")
	}
	if _, err := pki.JWKMatchesPin([]byte(p.JoinEncryptionJWK), p.Pins.JoinEncryption); err != nil {
		return invalid("--pki", "join encryption JWK: %v", err)
	}
	if p.ProxyCAPEM != "" {
		rest := []byte(p.ProxyCAPEM)
		for len(strings.TrimSpace(string(rest))) > 0 {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil || b.Type != "CERTIFICATE" || len(b.Headers) > 0 {
				return invalid("--proxy-ca-file", "not PEM certificates")
			}
		}
		if string(rest) != "" || !strings.HasSuffix(p.ProxyCAPEM, "-----\n") {
			return invalid("--proxy-ca-file", "not PEM certificates")
		}
	}
	if u := p.Update; u != nil {
		if len(u.ReleasePins) == 0 || u.ReleaseThreshold < 1 || u.ReleaseThreshold > len(u.ReleasePins) || u.ReleaseSequence < 0 {
			return invalid("--release-pins", "pins, threshold and sequence do not fit together")
		}
		for _, pin := range u.ReleasePins {
			if !pinRE.MatchString(pin) {
				return invalid("--release-pins", "%q is not sha256/<base64>", pin)
			}
		}
	}
	return nil
}

func checkDigests(flag string, m map[string]string) error {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, arch := range keys {
		if arch != "amd64" && arch != "arm64" {
			return invalid(flag, "unknown architecture %q", arch)
		}
		if !hexRE.MatchString(m[arch]) {
			return invalid(flag, "%s digest is not 64 lowercase hexadecimal digits", arch)
		}
	}
	if len(m) == 0 {
		return invalid(flag, "no digest")
	}
	return nil
}
