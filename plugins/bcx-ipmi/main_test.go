package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRunByHand(t *testing.T) {
	t.Setenv("BCD_BMC_PLUGIN", "")
	for _, c := range []struct {
		args       []string
		code       int
		out, error string
	}{
		{nil, 1, "", "bcx-ipmi is a bcd plugin: bcd site starts it"},
		{[]string{"version"}, 0, "bcx-ipmi ", ""},
		{[]string{"--password", "x"}, 2, "", "takes no arguments"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(c.args, &stdout, &stderr); code != c.code ||
			!strings.Contains(stdout.String(), c.out) || !strings.Contains(stderr.String(), c.error) {
			t.Errorf("run(%q) = %d, stdout %q, stderr %q", c.args, code, stdout.String(), stderr.String())
		}
	}
}
