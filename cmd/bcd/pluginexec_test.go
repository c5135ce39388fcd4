package main

import (
	"strings"
	"testing"
)

// TestPluginExecByHand: the launcher is bcd's to run; by hand it refuses, exits
// 126 and says why, and stays out of the help.
func TestPluginExecByHand(t *testing.T) {
	code, _, stderr := runBcd(t, "plugin-exec")
	if code != 126 || !strings.Contains(stderr, "[ERROR] bcd plugin-exec: bcd starts this itself") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	code, _, stderr = runBcd(t, "plugin-exec", "--name", "x", "--fd", "3", "--uid", "0", "--gid", "0")
	if code != 126 || !strings.Contains(stderr, "other than root") {
		t.Errorf("as root: exit %d, stderr %q", code, stderr)
	}
	_, out, _ := runBcd(t, "--help")
	if strings.Contains(out, "plugin-exec") {
		t.Errorf("help lists the hidden launcher:\n%s", out)
	}
}
