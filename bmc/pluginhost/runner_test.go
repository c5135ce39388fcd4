package pluginhost

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestPluginToHost: the plugin names its socket relative to its directory; the
// host only ever connects inside that directory.
func TestPluginToHost(t *testing.T) {
	r := &procRunner{name: "bcx-ipmi", socketDir: "/run/bcd/plugins/plugin-dir123"}
	for _, c := range []struct{ network, addr, want string }{
		{"unix", "./plugin4242", "/run/bcd/plugins/plugin-dir123/plugin4242"},
		{"unix", "plugin4242", "/run/bcd/plugins/plugin-dir123/plugin4242"},
		{"unix", "../plugin4242", ""},
		{"unix", "/run/other/sock", ""},
		{"unix", ".", ""},
		{"unix", "./", ""},
		{"unix", "a/b", ""},
		{"unix", "a\x00b", ""},
		{"tcp", "127.0.0.1:1234", ""},
	} {
		_, got, err := r.PluginToHost(c.network, c.addr)
		if c.want == "" && err == nil {
			t.Errorf("%s %q accepted as %q", c.network, c.addr, got)
		}
		if c.want != "" && (err != nil || got != c.want) {
			t.Errorf("%s %q = %q, %v", c.network, c.addr, got, err)
		}
	}
}

// FuzzPluginToHost: whatever address a plugin reports, the host connects only to
// a file directly inside the plugin's socket directory.
func FuzzPluginToHost(f *testing.F) {
	for _, s := range []string{"./plugin1", "plugin1", "../x", "/etc/passwd", "./a/../../b", ".", "..", "./.", "x\x00y"} {
		f.Add("unix", s)
	}
	f.Add("tcp", "127.0.0.1:1")
	f.Fuzz(func(t *testing.T, network, addr string) {
		dir := "/run/bcd/plugins/plugin-dir1"
		r := &procRunner{name: "p", socketDir: dir}
		n, got, err := r.PluginToHost(network, addr)
		if err != nil {
			return
		}
		if n != "unix" || filepath.Dir(got) != dir || filepath.Clean(got) != got || strings.HasPrefix(filepath.Base(got), ".") && filepath.Base(got) == ".." {
			t.Fatalf("%s %q → %s %q", network, addr, n, got)
		}
	})
}
