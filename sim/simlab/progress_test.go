package simlab

import (
	"bytes"
	"strings"
	"testing"

	"github.com/better-compute/bcd/sim"
)

// TestProgressTee: every line reaches the log, and only the progress lines,
// whole however they were split, reach the progress writer.
func TestProgressTee(t *testing.T) {
	var all, progress bytes.Buffer
	w := &progressTee{all: &all, progress: &progress}
	in := "01:00:00.0 sim: +10s map[pxe-booting:3]\n01:00:30.0 sim: " + sim.Progress + " +30s: 1 provisioned\n01:00:31.0 lab: fault\n"
	for _, chunk := range []string{in[:20], in[20:50], in[50:]} {
		w.Write([]byte(chunk))
	}
	if all.String() != in {
		t.Errorf("log = %q, want %q", all.String(), in)
	}
	if got := progress.String(); got != "01:00:30.0 sim: "+sim.Progress+" +30s: 1 provisioned\n" || strings.Count(got, "\n") != 1 {
		t.Errorf("progress = %q", got)
	}
}
