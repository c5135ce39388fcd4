package nodeagent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/protocol"
)

// served is a SiteMachines that answers n machines (saved), or err.
func served(n int, saved bool, err error) func(string) (int, bool, error) {
	return func(string) (int, bool, error) { return n, saved, err }
}

// TestDoctorNeighbours: a site agent's neighbours line shows gc_thresh3 beside the
// machines of its saved boot table and warns when the table is the smaller.
func TestDoctorNeighbours(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  string // gc_thresh3's content; "-" for no file
		served func(string) (int, bool, error)
		level  Level
		detail string
	}{
		{name: "room for the machines", limit: "4096\n", served: served(1000, true, nil), level: OK,
			detail: "net.ipv4.neigh.default.gc_thresh3 4096; the site serves 1000 machines"},
		{name: "the default table, more machines: overflows", limit: "1024\n", served: served(1100, true, nil), level: Warn,
			detail: "net.ipv4.neigh.default.gc_thresh3 1024, smaller than the 1100 machines the site serves"},
		{name: "no spec saved yet", limit: "1024\n", served: served(0, false, nil), level: OK,
			detail: "net.ipv4.neigh.default.gc_thresh3 1024; the site serves no machines yet (no spec saved in"},
		{name: "the saved spec does not read", limit: "1024\n", served: served(0, false, errors.New("saved spec: bad")), level: Warn,
			detail: "net.ipv4.neigh.default.gc_thresh3 1024; the machines the site serves are unknown: saved spec: bad"},
		{name: "no sysctl (another kernel)", limit: "-", served: served(10, true, nil), level: Warn,
			detail: "the neighbour table's capacity (net.ipv4.neigh.default.gc_thresh3) is unknown"},
		{name: "not a number", limit: "lots\n", served: served(10, true, nil), level: Warn, detail: `holds "lots", not a number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			limitFile := filepath.Join(dir, "gc_thresh3")
			if tc.limit != "-" {
				os.WriteFile(limitFile, []byte(tc.limit), 0o644)
			}
			r := checkNeighbours(&config.Config{DataDir: dir, Boot: &config.Boot{}}, limitFile, tc.served)
			if r.Level != tc.level || !strings.Contains(r.Detail, tc.detail) {
				t.Errorf("neighbours = %s: %s, want %s with %q", r.Level, r.Detail, tc.level, tc.detail)
			}
		})
	}
}

// TestDoctorNeighboursOnlyOnASite: bcd doctor has a neighbours line for a config
// with [boot] (a site agent) and none for a node's.
func TestDoctorNeighboursOnlyOnASite(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleNode)
	limitFile := filepath.Join(t.TempDir(), "gc_thresh3")
	os.WriteFile(limitFile, []byte("512\n"), 0o644)
	var askedDir string
	o := DoctorOptions{NeighbourLimitFile: limitFile, SiteMachines: func(dir string) (int, bool, error) {
		askedDir = dir
		return 600, true, nil
	}}
	_, out, _ := runDoctor(t, f.cfgPath, o)
	if strings.Contains(out, "neighbours:") {
		t.Errorf("a node's doctor has a neighbours line:\n%s", out)
	}
	b, err := os.ReadFile(f.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, "\n[boot]\nlisten = \"127.0.0.1:8080\"\nurl = \"http://127.0.0.1:8080\"\n"...)
	if err := os.WriteFile(f.cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, out, _ = runDoctor(t, f.cfgPath, o)
	if !strings.Contains(out, "\nneighbours: warn: net.ipv4.neigh.default.gc_thresh3 512, smaller than the 600 machines the site serves") {
		t.Errorf("a site's doctor has no neighbours warning:\n%s", out)
	}
	if askedDir != f.dataDir {
		t.Errorf("the machines were counted in %q, want data_dir %q", askedDir, f.dataDir)
	}
}
