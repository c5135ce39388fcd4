package config

import (
	"errors"
	"strings"
	"testing"
)

// TestMetricsSection: [metrics] listen is a host:port; the section is off
// when absent, and present without listen it says what is missing rather
// than open a port nobody asked for.
func TestMetricsSection(t *testing.T) {
	c, err := Parse([]byte(siteDoc+"\n[metrics]\nlisten = \"127.0.0.1:9464\"\n"), ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Metrics == nil || c.Metrics.Listen != "127.0.0.1:9464" {
		t.Fatalf("[metrics] = %+v", c.Metrics)
	}
	back, err := Parse(Format(c), ParseOptions{})
	if err != nil || back.Metrics == nil || back.Metrics.Listen != "127.0.0.1:9464" {
		t.Errorf("Format then Parse: %+v, %v\n%s", back, err, Format(c))
	}
	for _, listen := range []string{":9464", "[::1]:9464", "metrics.example.com:9464"} {
		if c, err := Parse([]byte(nodeDoc+"[metrics]\nlisten = \""+listen+"\"\n"), ParseOptions{}); err != nil || c.Metrics.Listen != listen {
			t.Errorf("listen %q: %+v %v", listen, c, err)
		}
	}

	c, err = Parse([]byte(siteDoc), ParseOptions{})
	if err != nil || c.Metrics != nil {
		t.Errorf("no [metrics]: %+v %v (want the section off)", c.Metrics, err)
	}

	for _, tc := range []struct{ doc, want string }{
		{"[metrics]\nlisten = \"9464\"\n", `line 9: [metrics] listen: "9464" is not host:port`},
		{"[metrics]\nlisten = \"127.0.0.1:0\"\n", `line 9: [metrics] listen: "127.0.0.1:0" has no valid port`},
		{"[metrics]\nlisten = \"127.0.0.1:99999\"\n", `line 9: [metrics] listen: "127.0.0.1:99999" has no valid port`},
		{"[metrics]\nlisten = \"bad_host!:9464\"\n", `line 9: [metrics] listen: "bad_host!:9464": "bad_host!" is neither an IP address nor a DNS name`},
		{"[metrics]\nlisten = 9464\n", "line 9: [metrics] listen must be a string, not an integer"},
		{"[metrics]\n", "[metrics] needs listen, the host:port of the /metrics endpoint"},
		{"[metrics]\nlisten = \"127.0.0.1:9464\"\npath = \"/m\"\n", `line 10: unknown key "path" in [metrics]`},
	} {
		_, err := Parse([]byte(nodeDoc+"\n"+tc.doc), ParseOptions{})
		var list ErrorList
		if !errors.As(err, &list) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an ErrorList with %q", tc.doc, err, tc.want)
		}
		if err != nil && list.Code() != ErrorCode {
			t.Errorf("%q: code %s", tc.doc, list.Code())
		}
	}
}
