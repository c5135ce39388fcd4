package installscript

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/pki"
)

// variant is one way of generating a script; the lint test crosses them.
type variant struct {
	name string
	edit func(t *testing.T, r *Request)
}

func withManifest(t *testing.T, r *Request) {
	k, pin := releaseKey(t)
	r.SHA256 = ""
	r.ReleaseManifest = writeManifest(t, "bcd", r.BCDVersion, 4, releaseFiles(r.BCDVersion, true), k)
	r.ReleasePins = pin
}

// scriptVariants lists every flag that changes the script, each way it can.
func scriptVariants() (attestors, modes, sources, extras []variant) {
	attestors = []variant{
		{"token", func(*testing.T, *Request) {}},
		{"tpm", func(_ *testing.T, r *Request) { r.Attestor = "tpm" }},
	}
	modes = []variant{
		{"root", func(*testing.T, *Request) {}},
		{"plugins", func(_ *testing.T, r *Request) { r.Plugins = true }},
		{"privileged", func(_ *testing.T, r *Request) { r.PluginsPriv = "kata,gvisor" }},
		{"install", func(_ *testing.T, r *Request) { r.InstallPlugins = "bcx-ipmi" }},
		{"unprivileged", func(_ *testing.T, r *Request) { r.Unprivileged = true }},
		{"bridges", func(_ *testing.T, r *Request) { r.Unprivileged = true; r.InstanceBridges = "br0,br-vm.1" }},
	}
	sources = []variant{
		{"sha256", func(*testing.T, *Request) {}},
		{"amd64only", func(_ *testing.T, r *Request) { r.SHA256 = "amd64=" + strings.Repeat("c", 64) }},
		{"manifest", withManifest},
	}
	extras = []variant{
		{"plain", func(*testing.T, *Request) {}},
		{"proxyca", func(t *testing.T, r *Request) { r.ProxyCAFile = filepath.Join(r.PKIDir, pki.ServingCACertFile) }},
	}
	return
}

// eachScript generates every combination and calls f with its name and text.
func eachScript(t *testing.T, f func(t *testing.T, script []byte)) {
	attestors, modes, sources, extras := scriptVariants()
	for _, a := range attestors {
		for _, m := range modes {
			for _, s := range sources {
				for _, e := range extras {
					if m.name == "install" && s.name != "manifest" {
						continue // --install-plugins needs a manifest
					}
					name := strings.Join([]string{a.name, m.name, s.name, e.name}, "-")
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						r := baseRequest(t)
						for _, v := range []variant{a, m, s, e} {
							v.edit(t, &r)
						}
						script, err := Build(r)
						if err != nil {
							t.Fatal(err)
						}
						f(t, script)
					})
				}
			}
		}
	}
}

func TestScriptsPassShellcheckAndParse(t *testing.T) {
	shellcheck := testenv.NeedTool(t, "shellcheck")
	dash := testenv.NeedTool(t, "dash")
	busybox := testenv.NeedTool(t, "busybox")
	eachScript(t, func(t *testing.T, script []byte) {
		path := filepath.Join(t.TempDir(), "install-bcd.sh")
		if err := os.WriteFile(path, script, 0o644); err != nil {
			t.Fatal(err)
		}
		// Every severity, style included: a clean script prints nothing.
		if out, err := exec.Command(shellcheck, "--shell=sh", "--severity=style", path).CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("shellcheck: %v\n%s", err, out)
		}
		if out, err := exec.Command(dash, "-n", path).CombinedOutput(); err != nil {
			t.Errorf("dash -n: %v\n%s", err, out)
		}
		if out, err := exec.Command(busybox, "sh", "-n", path).CombinedOutput(); err != nil {
			t.Errorf("busybox sh -n: %v\n%s", err, out)
		}
	})
}

func TestScriptsEmbedNoSecretAndTheUnits(t *testing.T) {
	eachScript(t, func(t *testing.T, script []byte) {
		s := string(script)
		if !strings.HasPrefix(s, "#!/bin/sh\n") {
			t.Error("no #!/bin/sh line")
		}
		for _, want := range []string{"\nset -eu\n", "\numask 077\n", "#   pool:      pool_h100\n", "#   site:      fsn1\n",
			"#   bcd:       0.1.0\n", "#   attestor:  ", BCDUnit, "gateway_url = \"https://gw.eu.example.com\"\nsite = \"fsn1\"\n",
			"DOWNLOADS='https://compute.example.com/bc/downloads'", `"$DOWNLOADS/bcd/$BCD_VERSION/linux-$arch"`,
			"bcd upgraded to $BCD_VERSION and restarted.", PluginsDropIn + PrivilegedDropIn, HelperUnit, UnprivilegedDropIn, UpdateDropIn} {
			if !strings.Contains(s, want) {
				t.Errorf("script lacks %q", want)
			}
		}
		for _, bad := range []string{"PRIVATE KEY", `"d":`, "bcjt_" + "x"} {
			if strings.Contains(s, bad) {
				t.Errorf("script holds %q", bad)
			}
		}
		// The token never reaches an argument list.
		if regexp.MustCompile(`join[^\n]*\$token`).MatchString(s) {
			t.Error("the token is passed to bcd join as an argument")
		}
	})
}

func TestScriptFollowsTheFlags(t *testing.T) {
	gen := func(edit func(r *Request)) string {
		t.Helper()
		r := baseRequest(t)
		edit(&r)
		s, err := Build(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(s)
	}
	plain := gen(func(*Request) {})
	if strings.Contains(plain, "[plugins]\ndir") || strings.Contains(plain, "[helper]\nsocket") || strings.Contains(plain, "[update]\nrelease") {
		t.Error("a plain script adds sections")
	}
	if !strings.Contains(plain, "IFS= read -r token") || strings.Contains(plain, "/dev/tpmrm0 (the") {
		t.Error("a token script does not read the token, or checks the TPM")
	}
	tpm := gen(func(r *Request) { r.Attestor = "tpm" })
	if strings.Contains(tpm, "read -r token") || !strings.Contains(tpm, "--attestor tpm </dev/null") ||
		!strings.Contains(tpm, "unset BCD_JOIN_TOKEN") || !strings.Contains(tpm, "policy decides where it joins") {
		t.Error("a TPM script reads a token or does not join with the TPM")
	}
	priv := gen(func(r *Request) { r.PluginsPriv = "kata" })
	if !strings.Contains(priv, "[plugins]\ndir = \"/usr/local/lib/bcd/plugins\"\ncgroup = \"/sys/fs/cgroup/system.slice/bcd.service/plugins\"\nprivileged = \"kata\"\n") {
		t.Error("--privileged-plugins does not write [plugins] privileged")
	}
	helper := gen(func(r *Request) { r.Unprivileged = true; r.InstanceBridges = "br0,br1" })
	if !strings.Contains(helper, "[helper]\nsocket = \"/run/bcd-helper/helper.sock\"\nuser = \"bcd\"\ninstance_bridges = \"br0, br1\"\n") {
		t.Error("--unprivileged --instance-bridges does not write [helper]")
	}
	k, pin := releaseKey(t)
	files := releaseFiles("0.1.0", true)
	man := writeManifest(t, "bcd", "0.1.0", 12, files, k)
	withMan := gen(func(r *Request) {
		r.SHA256, r.ReleaseManifest, r.ReleasePins, r.InstallPlugins = "", man, pin, "bcx-ipmi"
	})
	for _, want := range []string{
		"SHA256_AMD64='" + sum(files["bcd_0.1.0_linux_amd64"]) + "'",
		"SHA256_ARM64='" + sum(files["bcd_0.1.0_linux_arm64"]) + "'",
		"fetch_plugin 'bcx-ipmi' '" + sum(files["bcx-ipmi_0.1.0_linux_amd64.tar.gz"]) + "' '" + sum(files["bcx-ipmi_0.1.0_linux_arm64.tar.gz"]) + "'",
		"[update]\nrelease_pins = \"" + pin + "\"\nrelease_threshold = 1\nrelease_sequence = 12\n",
	} {
		if !strings.Contains(withMan, want) {
			t.Errorf("manifest script lacks %q", want)
		}
	}
	// Archives and checksums are never taken for the binary.
	for _, other := range []string{"bcd_0.1.0_linux_amd64.tar.gz", "checksums.txt", "bcd_0.1.0_linux_amd64.tar.gz.sha256"} {
		if strings.Contains(withMan, sum(files[other])) {
			t.Errorf("the script pins %s", other)
		}
	}
}

func TestManifestRefusals(t *testing.T) {
	k, pin := releaseKey(t)
	_, pin2 := releaseKey(t)
	for _, tc := range []struct {
		name    string
		product string
		version string
		files   map[string][]byte
		edit    func(r *Request)
		want    error
		text    string
	}{
		{"other version", "bcd", "0.2.0", releaseFiles("0.2.0", false), nil, pki.ErrReleaseMismatch, "want 0.1.0"},
		{"other product", "bcx-ipmi", "0.1.0", releaseFiles("0.1.0", false), nil, pki.ErrReleaseMismatch, `want "bcd"`},
		{"no plugin archives", "bcd", "0.1.0", releaseFiles("0.1.0", false), func(r *Request) { r.InstallPlugins = "bcx-ipmi" },
			pki.ErrReleaseIncomplete, "bcx-ipmi_0.1.0_linux_amd64.tar.gz"},
		{"no bare binary", "bcd", "0.1.0", map[string][]byte{"bcd_0.1.0_linux_amd64.tar.gz": []byte("a")}, nil,
			pki.ErrReleaseIncomplete, "no bare bcd binary"},
		{"unpinned signer", "bcd", "0.1.0", releaseFiles("0.1.0", false), func(r *Request) { r.ReleasePins = pin2 },
			pki.ErrReleaseUntrusted, "signed by 0"},
		{"threshold", "bcd", "0.1.0", releaseFiles("0.1.0", false), func(r *Request) {
			r.ReleasePins = pin + "," + pin2
			r.ReleaseThreshold, r.ThresholdGiven = 2, true
		}, pki.ErrReleaseUntrusted, "threshold is 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := baseRequest(t)
			r.SHA256 = ""
			r.ReleaseManifest = writeManifest(t, tc.product, tc.version, 1, tc.files, k)
			r.ReleasePins = pin
			if tc.edit != nil {
				tc.edit(&r)
			}
			_, err := Build(r)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("err = %v, want %v with %q", err, tc.want, tc.text)
			}
			var in *InputError
			if errors.As(err, &in) {
				t.Errorf("a release refusal is an input error: %v", err)
			}
		})
	}
}

func TestFlagCombinationsRefused(t *testing.T) {
	k, pin := releaseKey(t)
	man := writeManifest(t, "bcd", "0.1.0", 1, releaseFiles("0.1.0", true), k)
	for _, tc := range []struct {
		name string
		flag string
		edit func(r *Request)
	}{
		{"both sources", "--sha256", func(r *Request) { r.ReleaseManifest, r.ReleasePins = man, pin }},
		{"no source", "--sha256", func(r *Request) { r.SHA256 = "" }},
		{"pins without manifest", "--release-pins", func(r *Request) { r.ReleasePins = pin }},
		{"threshold without manifest", "--release-threshold", func(r *Request) { r.ThresholdGiven, r.ReleaseThreshold = true, 1 }},
		{"manifest without pins", "--release-pins", func(r *Request) { r.SHA256, r.ReleaseManifest = "", man }},
		{"threshold above pins", "--release-threshold", func(r *Request) {
			r.SHA256, r.ReleaseManifest, r.ReleasePins, r.ThresholdGiven, r.ReleaseThreshold = "", man, pin, true, 2
		}},
		{"zero threshold", "--release-threshold", func(r *Request) {
			r.SHA256, r.ReleaseManifest, r.ReleasePins, r.ThresholdGiven, r.ReleaseThreshold = "", man, pin, true, 0
		}},
		{"install without manifest", "--install-plugins", func(r *Request) { r.InstallPlugins = "bcx-ipmi" }},
		{"install unknown plugin", "--install-plugins", func(r *Request) {
			r.SHA256, r.ReleaseManifest, r.ReleasePins, r.InstallPlugins = "", man, pin, "bcx-redfish"
		}},
		{"install unprivileged", "--install-plugins", func(r *Request) {
			r.SHA256, r.ReleaseManifest, r.ReleasePins, r.InstallPlugins, r.Unprivileged = "", man, pin, "bcx-ipmi", true
		}},
		{"plugins unprivileged", "--plugins", func(r *Request) { r.Plugins, r.Unprivileged = true, true }},
		{"privileged unprivileged", "--privileged-plugins", func(r *Request) { r.PluginsPriv, r.Unprivileged = "kata", true }},
		{"bridges without unprivileged", "--instance-bridges", func(r *Request) { r.InstanceBridges = "br0" }},
		{"missing pki", "--pki", func(r *Request) { r.PKIDir = "" }},
		{"not a pki", "--pki", func(r *Request) { r.PKIDir = t.TempDir() }},
		{"proxy ca not pem", "--proxy-ca-file", func(r *Request) { r.ProxyCAFile = man }},
		{"private key as proxy ca", "--proxy-ca-file", func(r *Request) {
			r.ProxyCAFile = filepath.Join(r.PKIDir, pki.JoinSigningKeyFile)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := baseRequest(t)
			tc.edit(&r)
			_, err := Build(r)
			var in *InputError
			if !errors.As(err, &in) || in.Flag != tc.flag || !strings.HasPrefix(err.Error(), "INVALID_INPUT: "+tc.flag+": ") {
				t.Fatalf("err = %v, want INVALID_INPUT naming %s", err, tc.flag)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Errorf("the error quotes a private key: %v", err)
			}
		})
	}
}

// Bad values of every flag are tested end to end, with the exit code, in
// cmd/better-compute; this checks the generator refuses the same values
// when Params are built by hand.
func TestGenerateChecksParams(t *testing.T) {
	r := baseRequest(t)
	good, err := r.Params()
	if err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(p *Params){
		"pool":      func(p *Params) { p.Pool = "x'y" },
		"site":      func(p *Params) { p.Site = "a b" },
		"gateway":   func(p *Params) { p.GatewayURL = "https://x/$(id)" },
		"downloads": func(p *Params) { p.DownloadsURL = "https://x/a'b/downloads" },
		"version":   func(p *Params) { p.Version = "1.0.0;reboot" },
		"digest":    func(p *Params) { p.SHA256 = map[string]string{"amd64": "`id`"} },
		"arch":      func(p *Params) { p.SHA256 = map[string]string{"riscv64": strings.Repeat("a", 64)} },
		"privilege": func(p *Params) { p.Privileged = []string{"a\nb"} },
		"bridge":    func(p *Params) { p.Unprivileged = true; p.InstanceBridges = []string{"br0\""} },
		"plugin": func(p *Params) {
			p.Install = []Plugin{{Name: "x", SHA256: map[string]string{"amd64": strings.Repeat("a", 64)}}}
		},
		"pin":     func(p *Params) { p.Pins.JoinSigning = "sha256/'" },
		"jwk":     func(p *Params) { p.JoinEncryptionJWK = "{}\nBCD_EOF\nreboot\n" },
		"proxyca": func(p *Params) { p.ProxyCAPEM = "-----BEGIN CERTIFICATE-----\nBCD_EOF\n" },
		"update":  func(p *Params) { p.Update = &Update{ReleasePins: []string{"x"}, ReleaseThreshold: 1} },
	} {
		p := *good
		edit(&p)
		if _, err := Generate(&p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Generate(good); err != nil {
		t.Fatal(err)
	}
}

func TestSystemdAnalyzeVerifiesTheUnits(t *testing.T) {
	analyze := testenv.NeedTool(t, "systemd-analyze")
	system, err := filepath.Glob("/usr/lib/systemd/system/*.target")
	if err != nil || len(system) == 0 {
		testenv.Skip(t, "no systemd unit files in /usr/lib/systemd/system to verify against")
	}
	for _, tc := range []struct {
		name    string
		dropIns map[string]string
	}{
		{"root", nil},
		{"plugins", map[string]string{"plugins.conf": PluginsDropIn}},
		{"privileged", map[string]string{"plugins.conf": PluginsDropIn + PrivilegedDropIn}},
		{"unprivileged", map[string]string{"unprivileged.conf": UnprivilegedDropIn}},
		{"update", map[string]string{"40-bcd-update.conf": UpdateDropIn}},
		{"update and plugins", map[string]string{"40-bcd-update.conf": UpdateDropIn, "plugins.conf": PluginsDropIn}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write := func(path, content string, mode os.FileMode) {
				t.Helper()
				full := filepath.Join(root, path)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(full, []byte(content), mode); err != nil {
					t.Fatal(err)
				}
			}
			// The stock units the service depends on (sysinit.target, ...).
			for _, f := range system {
				if data, err := os.ReadFile(f); err == nil {
					write(f, string(data), 0o644)
				}
			}
			write("usr/local/bin/bcd", "#!/bin/sh\n", 0o755)
			write(UnitPath, BCDUnit, 0o644)
			write(HelperUnitPath, HelperUnit, 0o644)
			for name, content := range tc.dropIns {
				write(filepath.Join(DropInDir, name), content, 0o644)
			}
			out, err := exec.Command(analyze, "verify", "--man=no", "--root="+root, "bcd.service", "bcd-helper.service").CombinedOutput()
			if err != nil {
				t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
			}
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				// systemd before 254 does not know DelegateSubgroup= and
				// ignores it; the spec relies on exactly that.
				if line != "" && !strings.Contains(line, "Unknown key 'DelegateSubgroup'") && !strings.Contains(line, "Unknown key name 'DelegateSubgroup'") {
					t.Errorf("systemd-analyze: %s", line)
				}
			}
			// The check has teeth: without the binary, verify fails.
			if err := os.Remove(filepath.Join(root, "usr/local/bin/bcd")); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(analyze, "verify", "--man=no", "--root="+root, "bcd.service").CombinedOutput(); err == nil {
				t.Errorf("verify passed without the ExecStart binary:\n%s", out)
			}
		})
	}
}

// FuzzInputPatterns: whatever the value, an accepted one carries nothing
// that could end sh single quotes, a here-document line or a TOML string.
func FuzzInputPatterns(f *testing.F) {
	for _, s := range []string{"fsn1", "https://x.example.com/bc", "amd64=" + strings.Repeat("a", 64), "br0,br1", "a'b", "$(id)", "`id`", "a\nb", "é", ""} {
		f.Add(s)
	}
	unsafe := func(s string) bool { return strings.ContainsAny(s, "'\"\\$`\n\r ;&|<>(){}*?#!") }
	f.Fuzz(func(t *testing.T, s string) {
		if checkID("--site", s) == nil && unsafe(s) {
			t.Errorf("id %q accepted", s)
		}
		if u, err := checkHTTPS("--base-url", s); err == nil && (unsafe(u) || !strings.HasPrefix(u, "https://")) {
			t.Errorf("url %q accepted as %q", s, u)
		}
		for _, re := range []*regexp.Regexp{nameRE, bridgeRE, pinRE} {
			if list, err := names("--x", s, re); err == nil {
				for _, n := range list {
					if unsafe(n) || strings.Contains(n, ",") {
						t.Errorf("name %q accepted", n)
					}
				}
			}
		}
		if m, err := parseSHA256(s); err == nil {
			for k, v := range m {
				if !hexRE.MatchString(v) || (k != "amd64" && k != "arm64") {
					t.Errorf("digest %s=%q accepted", k, v)
				}
			}
		}
	})
}
