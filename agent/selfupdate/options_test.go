package selfupdate

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/config"
)

// TestOptionsFor: the slots and records are found the way bcd update and bcd
// doctor find them: [update] slots_dir, else root's directory under the
// helper (records there too), else <data_dir>/bin with the records in
// data_dir.
func TestOptionsFor(t *testing.T) {
	data := filepath.Join(string(filepath.Separator), "srv", "bcd-data")
	own := filepath.Join(string(filepath.Separator), "opt", "bcd-slots")
	tests := []struct {
		name             string
		c                config.Config
		slots, records   string
		entrypoint, data string
	}{
		{name: "defaults", slots: filepath.Join(config.DefaultDataDir, "bin"), records: config.DefaultDataDir,
			entrypoint: config.DefaultEntrypoint, data: config.DefaultDataDir},
		{name: "data_dir", c: config.Config{DataDir: data}, slots: filepath.Join(data, "bin"), records: data,
			entrypoint: config.DefaultEntrypoint, data: data},
		{name: "helper", c: config.Config{DataDir: data, Helper: &config.Helper{}}, slots: config.DefaultHelperSlotsDir,
			records: config.DefaultHelperSlotsDir, entrypoint: config.DefaultEntrypoint, data: data},
		{name: "slots_dir", c: config.Config{DataDir: data, Update: &config.Update{SlotsDir: own, Entrypoint: "/bin/bcd", ReleasePins: []string{"p"}, ReleaseThreshold: 1, ReleaseSequence: 4}},
			slots: own, records: data, entrypoint: "/bin/bcd", data: data},
		{name: "slots_dir under the helper", c: config.Config{Helper: &config.Helper{}, Update: &config.Update{SlotsDir: own}},
			slots: own, records: own, entrypoint: config.DefaultEntrypoint, data: config.DefaultDataDir},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := OptionsFor(&tt.c, "/etc/bcd/config.toml")
			if o.SlotsDir != tt.slots || o.RecordsDir != tt.records || o.Entrypoint != tt.entrypoint || o.DataDir != tt.data {
				t.Errorf("slots %s records %s entrypoint %s data %s", o.SlotsDir, o.RecordsDir, o.Entrypoint, o.DataDir)
			}
			if o.ConfigPath != "/etc/bcd/config.toml" || o.Threshold < 1 {
				t.Errorf("%+v", o)
			}
			if tt.c.Update != nil && (o.ConfigFloor != tt.c.Update.ReleaseSequence || len(o.Pins) != len(tt.c.Update.ReleasePins)) {
				t.Errorf("pins %v floor %d", o.Pins, o.ConfigFloor)
			}
		})
	}
}

// TestNewRefuses: options a Manager cannot work with.
func TestNewRefuses(t *testing.T) {
	h := newHost(t)
	for name, edit := range map[string]func(*Options){
		"relative slots dir":          func(o *Options) { o.SlotsDir = "bin" },
		"no records dir":              func(o *Options) { o.RecordsDir = "" },
		"no running version":          func(o *Options) { o.Running = "" },
		"systemd without config path": func(o *Options) { o.Systemd, o.ConfigPath = true, "" },
	} {
		o := h.opts
		edit(&o)
		if _, err := New(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestExec replaces a real process with the entrypoint: the test binary
// runs itself as a child, which execs a shell script through the
// entrypoint's symlink and the slots' current link.
func TestExec(t *testing.T) {
	if entry := os.Getenv("BCD_SELFUPDATE_TEST_EXEC"); entry != "" {
		m, err := New(Options{SlotsDir: filepath.Dir(entry), RecordsDir: filepath.Dir(entry), DataDir: filepath.Dir(entry),
			Entrypoint: entry, Running: "0.1.0"})
		if err != nil {
			t.Fatal(err)
		}
		t.Fatal(m.Exec()) // reached only when the exec failed
	}
	h := newHost(t)
	h.update("0.1.0", h.section("0.2.0", 5))
	script := "#!/bin/sh\necho \"exec'd bcd 0.2.0 with $1\"\n"
	must(t, os.WriteFile(filepath.Join(h.slotsDir(), "bcd-b"), []byte(script), 0o755))
	cmd := exec.Command(os.Args[0], "-test.run=^TestExec$")
	cmd.Env = append(os.Environ(), "BCD_SELFUPDATE_TEST_EXEC="+h.opts.Entrypoint)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "exec'd bcd 0.2.0 with -test.run=^TestExec$") {
		t.Fatalf("the child: %v\n%s", err, out)
	}
}
