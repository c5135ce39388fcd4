package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestFormatTimeline: the demo's timeline comes from machines events -o json.
func TestFormatTimeline(t *testing.T) {
	raw := `{"machine":"m_1","events":[
{"time":"2026-11-30T02:57:37.67Z","kind":"machine.added","message":"added to site lab"},
{"time":"2026-11-30T02:58:23.8Z","kind":"state","message":"provisioned: node ready"}]}`
	var out bytes.Buffer
	formatTimeline(&out, "bios1 (bios)", []byte(raw))
	got := out.String()
	for _, want := range []string{"== timeline of bios1 (bios)", "+0s", "machine.added", "+46.1s", "provisioned: node ready"} {
		if !strings.Contains(got, want) {
			t.Errorf("timeline lacks %q:\n%s", want, got)
		}
	}
}
