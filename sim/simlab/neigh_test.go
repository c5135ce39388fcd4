package simlab

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNeighbourLimitsRaisedForAFleet: before 1,000 machines the lab raises the
// neighbour table's limits (the default 1024 would overflow), leaves a table with
// room alone, and puts back what it changed.
func TestNeighbourLimitsRaisedForAFleet(t *testing.T) {
	for _, tc := range []struct {
		name           string
		machines       int
		thresh3, thr2  string
		want3, want2   string
		changedMessage string
	}{
		{name: "1,000 machines, the default table", machines: 1000, thresh3: "1024", thr2: "512", want3: "2256", want2: "2256",
			changedMessage: "gc_thresh3 1024 → 2256, gc_thresh2 512 → 2256"},
		{name: "200 machines fit", machines: 200, thresh3: "1024", thr2: "512", want3: "1024", want2: "512"},
		{name: "a raised table is kept", machines: 1000, thresh3: "8192", thr2: "4096", want3: "8192", want2: "4096"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write := func(name, v string) {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			read := func(name string) string {
				b, _ := os.ReadFile(filepath.Join(dir, name))
				return strings.TrimSpace(string(b))
			}
			write("gc_thresh3", tc.thresh3)
			write("gc_thresh2", tc.thr2)
			restore, changed, err := raiseNeighbourLimits(dir, tc.machines)
			if err != nil {
				t.Fatal(err)
			}
			if got3, got2 := read("gc_thresh3"), read("gc_thresh2"); got3 != tc.want3 || got2 != tc.want2 || changed != tc.changedMessage {
				t.Errorf("gc_thresh3 %s, gc_thresh2 %s (%q), want %s, %s (%q)", got3, got2, changed, tc.want3, tc.want2, tc.changedMessage)
			}
			restore()
			if got3, got2 := read("gc_thresh3"), read("gc_thresh2"); got3 != tc.thresh3 || got2 != tc.thr2 {
				t.Errorf("restored gc_thresh3 %s, gc_thresh2 %s, want %s, %s", got3, got2, tc.thresh3, tc.thr2)
			}
		})
	}
	if _, _, err := raiseNeighbourLimits(t.TempDir(), 1000); err == nil || !strings.Contains(err.Error(), "gc_thresh3") {
		t.Errorf("no sysctl files: %v, want an error naming gc_thresh3", err)
	}
}
