package agent_test

import (
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
)

// TestDownloadTLSConfig: a release download trusts the control plane's serving
// CA by its pin (and the system roots), never another CA.
func TestDownloadTLSConfig(t *testing.T) {
	ours, theirs := agenttest.New(t), agenttest.New(t)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "binary") })
	oursAPI, theirsAPI := ours.API(t, ok), theirs.API(t, ok)
	for _, tc := range []struct {
		name, pin, url string
		trusted        bool
	}{
		{"the pinned serving CA", ours.Pins.ServingCA, oursAPI.URL, true},
		{"another CA", ours.Pins.ServingCA, theirsAPI.URL, false},
		{"no pin: system roots only", "", oursAPI.URL, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := agent.DownloadTLSConfig(tc.pin)
			if err != nil {
				t.Fatal(err)
			}
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
			defer c.CloseIdleConnections()
			resp, err := c.Get(tc.url + "/bcd")
			if tc.trusted {
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return
			}
			var te *agent.TrustError
			if err == nil {
				resp.Body.Close()
			}
			if !errors.As(err, &te) {
				t.Fatalf("got %v, want a TrustError", err)
			}
		})
	}
	if _, err := agent.DownloadTLSConfig("sha256/nope"); err == nil {
		t.Error("accepted a malformed pin")
	}
}
