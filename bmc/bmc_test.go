package bmc

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestErrorKinds(t *testing.T) {
	cause := errors.New("cause")
	err := Errorf(KindAuth, "login of %s: %w", "admin", cause)
	if KindOf(err) != KindAuth || !errors.Is(err, cause) || err.Error() != "login of admin: cause" {
		t.Errorf("Errorf: %v kind %s", err, KindOf(err))
	}
	if KindOf(fmt.Errorf("wrapped: %w", err)) != KindAuth {
		t.Error("the kind is lost when wrapped")
	}
	if KindOf(nil) != "" || KindOf(errors.New("x")) != KindInternal {
		t.Error("KindOf of nil or a plain error")
	}
}

func TestSecretNeverPrints(t *testing.T) {
	h := Host{Name: "m-1", Address: "10.0.0.1", Username: "admin", Password: secret}
	var b strings.Builder
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		fmt.Fprintf(&b, f+" ", h)
		fmt.Fprintf(&b, f+" ", h.Password)
		fmt.Fprintf(&b, f+" ", &h)
		fmt.Fprintf(&b, f+" ", []Host{h})
		fmt.Fprintf(&b, f+" ", map[string]Host{"a": h})
	}
	slog.New(slog.NewJSONHandler(&b, nil)).Info("x", "host", h, "password", h.Password, "hosts", []Host{h})
	slog.New(slog.NewTextHandler(&b, nil)).Info("x", "host", h, "password", h.Password)
	for _, s := range []string{secret, fmt.Sprintf("%x", secret), fmt.Sprintf("%X", secret)} {
		if strings.Contains(b.String(), s) {
			t.Fatalf("formatting shows the password: %s", b.String())
		}
	}
	if h.Addr() != "10.0.0.1:623" || h.String() != "m-1 (10.0.0.1:623)" {
		t.Errorf("Addr %q String %q", h.Addr(), h.String())
	}
}
