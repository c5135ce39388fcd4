package protocol

import (
	"strings"
	"testing"
)

func TestBootNonce(t *testing.T) {
	n, err := NewBootNonce()
	if err != nil || len(n) != 22 || !ValidBootNonce(n) {
		t.Fatalf("NewBootNonce = %q, %v", n, err)
	}
	if m, _ := NewBootNonce(); m == n {
		t.Error("two nonces alike")
	}
	for s, want := range map[string]bool{
		strings.Repeat("a", 15): false, strings.Repeat("a", 16): true,
		strings.Repeat("a", 256): true, strings.Repeat("a", 257): false,
		"aaaaaaaa aaaaaaaa": false, `aaaaaaaa"aaaaaaaa`: false, "aaaaaaaa\naaaaaaa": false,
	} {
		if got := ValidBootNonce(s); got != want {
			t.Errorf("ValidBootNonce(%q) = %v", s, got)
		}
	}
}
