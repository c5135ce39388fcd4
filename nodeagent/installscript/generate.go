package installscript

import (
	"bytes"
	_ "embed"
	"fmt"
	"strings"
	"text/template"

	"github.com/better-compute/bcd/internal/version"
)

//go:embed install.sh.tmpl
var scriptText string

var scriptTmpl = template.Must(template.New("install.sh").Option("missingkey=error").Parse(scriptText))

// The sections the script appends to config.toml when they are missing.
const (
	// PluginsDir is [plugins] dir, where the script installs plugins.
	PluginsDir = "/usr/local/lib/bcd/plugins"
	// PluginsCgroup is [plugins] cgroup, a child of bcd's delegated cgroup.
	PluginsCgroup = "/sys/fs/cgroup/system.slice/bcd.service/plugins"
	// PluginPinsFile is the pins file in PluginsDir: one line per plugin,
	// "<sha256 hex>  <name>", the format sha256sum writes and checks.
	PluginPinsFile = PluginsDir + "/pins"
)

type digest struct{ Arch, Sum string }

type plugin struct{ Name, AMD64, ARM64 string }

type updateView struct {
	Pins      string
	Threshold int
	Sequence  int64
}

// view is what the template sees: every value already checked, and already
// in the form it is embedded in.
type view struct {
	Generator, PluginsDir            string
	Pool, Site, Version              string
	GatewayURL, DownloadsURL         string
	Digests                          []digest
	SHA256AMD64, SHA256ARM64         string
	TPM, Unprivileged, Plugins       bool
	Privileged, InstanceBridges      string
	Install                          []plugin
	Update                           *updateView
	ConfigTop                        string
	PluginsSection, HelperSection    string
	UpdateSection                    string
	JWK, ProxyCA                     string
	BCDUnit, HelperUnit              string
	PluginsDropIn, PrivilegedDropIn  string
	UnprivilegedDropIn, UpdateDropIn string
}

// Generate renders the install script for p. It checks p first with the
// same patterns Request.Params applies, so a Params built by hand cannot
// smuggle a value past them either.
func Generate(p *Params) ([]byte, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	v := view{
		Generator:    version.String("better-compute"),
		PluginsDir:   PluginsDir,
		Pool:         p.Pool,
		Site:         p.Site,
		Version:      p.Version,
		GatewayURL:   p.GatewayURL,
		DownloadsURL: p.DownloadsURL,
		SHA256AMD64:  p.SHA256["amd64"],
		SHA256ARM64:  p.SHA256["arm64"],
		TPM:          p.TPM,
		Unprivileged: p.Unprivileged,
		Plugins:      p.Plugins || len(p.Install) > 0 || len(p.Privileged) > 0,
		Privileged:   strings.Join(p.Privileged, ", "),
		// A list in config.toml is one comma-separated string (the
		// subset has no arrays).
		InstanceBridges:    strings.Join(p.InstanceBridges, ", "),
		JWK:                p.JoinEncryptionJWK,
		ProxyCA:            p.ProxyCAPEM,
		BCDUnit:            BCDUnit,
		HelperUnit:         HelperUnit,
		PluginsDropIn:      PluginsDropIn,
		PrivilegedDropIn:   PrivilegedDropIn,
		UnprivilegedDropIn: UnprivilegedDropIn,
		UpdateDropIn:       UpdateDropIn,
	}
	for _, arch := range arches {
		if s := p.SHA256[arch]; s != "" {
			v.Digests = append(v.Digests, digest{arch, s})
		}
	}
	for _, pl := range p.Install {
		v.Install = append(v.Install, plugin{pl.Name, pl.SHA256["amd64"], pl.SHA256["arm64"]})
	}

	var top strings.Builder
	top.WriteString("# Written by the better-compute install script. bcd refuses unknown keys.\n")
	fmt.Fprintf(&top, "gateway_url = %q\n", p.GatewayURL)
	fmt.Fprintf(&top, "site = %q\n", p.Site)
	top.WriteString(p.Pins.ConfigLines())
	v.ConfigTop = top.String()

	var sec strings.Builder
	fmt.Fprintf(&sec, "[plugins]\ndir = %q\ncgroup = %q\n", PluginsDir, PluginsCgroup)
	if v.Privileged != "" {
		fmt.Fprintf(&sec, "privileged = %q\n", v.Privileged)
	}
	v.PluginsSection = sec.String()

	sec.Reset()
	fmt.Fprintf(&sec, "[helper]\nsocket = %q\nuser = %q\n", "/run/bcd-helper/helper.sock", "bcd")
	if v.InstanceBridges != "" {
		fmt.Fprintf(&sec, "instance_bridges = %q\n", v.InstanceBridges)
	}
	v.HelperSection = sec.String()

	if u := p.Update; u != nil {
		v.Update = &updateView{Pins: strings.Join(u.ReleasePins, ", "), Threshold: u.ReleaseThreshold, Sequence: u.ReleaseSequence}
		v.UpdateSection = fmt.Sprintf("[update]\nrelease_pins = %q\nrelease_threshold = %d\nrelease_sequence = %d\n",
			v.Update.Pins, u.ReleaseThreshold, u.ReleaseSequence)
	}

	var out bytes.Buffer
	if err := scriptTmpl.Execute(&out, v); err != nil {
		return nil, fmt.Errorf("install script: %w", err)
	}
	return out.Bytes(), nil
}
