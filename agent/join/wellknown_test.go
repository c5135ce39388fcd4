package join

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/pki"
)

func TestCheckWellKnown(t *testing.T) {
	g := agenttest.New(t)
	doc := g.WellKnown()
	b, err := CheckWellKnown(&doc, g.Pins, "wk", false, false)
	if err != nil {
		t.Fatal(err)
	}
	if b.GatewayURL != g.URL || b.Pins != g.Pins || b.EncryptionKey == nil {
		t.Errorf("bootstrap = %+v", b)
	}
	// A host build needs every pin given.
	if _, err := CheckWellKnown(&doc, pki.Pins{}, "wk", false, false); err == nil {
		t.Error("accepted a document without pins on a host build")
	}
	// A fakehw build takes them from the document.
	if b, err := CheckWellKnown(&doc, pki.Pins{}, "wk", true, true); err != nil || b.Pins != g.Pins {
		t.Errorf("fakehw: %+v, %v", b, err)
	}
	// An http:// gateway only on fakehw.
	doc.Gateway.URL = "http://127.0.0.1:1"
	if _, err := CheckWellKnown(&doc, g.Pins, "wk", false, false); err == nil || !strings.Contains(err.Error(), "https://") {
		t.Errorf("http gateway on a host build: %v", err)
	}
	if _, err := CheckWellKnown(&doc, g.Pins, "wk", true, true); err != nil {
		t.Errorf("http gateway on fakehw: %v", err)
	}
}

func FuzzWellKnown(f *testing.F) {
	g := agenttest.New(f)
	good, _ := json.Marshal(g.WellKnown())
	f.Add(good)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"gateway":{"url":"https://gw"},"join":{"encryptionJwk":{"kty":"EC"}}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := ParseWellKnown(data)
		if err != nil {
			return
		}
		b, err := CheckWellKnown(doc, g.Pins, "wk", false, false)
		if err != nil {
			return
		}
		// Whatever the document says, what bcd joins with is what was pinned.
		if b.Pins != g.Pins {
			t.Fatalf("pins %+v, want the given ones", b.Pins)
		}
		if err := pki.MatchPin(g.Pins.JoinEncryption, b.EncryptionKey); err != nil {
			t.Fatalf("accepted an unpinned encryption key: %v", err)
		}
		if !strings.HasPrefix(b.GatewayURL, "https://") {
			t.Fatalf("accepted gateway %q", b.GatewayURL)
		}
	})
}
