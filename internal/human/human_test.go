package human

import (
	"strings"
	"testing"
)

func TestShort(t *testing.T) {
	long := strings.Repeat("a", 100)
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 64, "abc"},
		{long[:64], 64, long[:64]},
		{long, 64, long[:64] + "…"},
		{long, 80, long[:80] + "…"},
	} {
		if got := ShortN(tc.in, tc.n); got != tc.want {
			t.Errorf("ShortN(%d bytes, %d) = %q", len(tc.in), tc.n, got)
		}
	}
	if Short(long) != ShortN(long, DefaultShort) {
		t.Error("Short is not ShortN(DefaultShort)")
	}
}

func TestSize(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		2 << 30: "2.0 GiB", 1 << 60: "1.0 EiB",
	} {
		if got := Size(n); got != want {
			t.Errorf("Size(%d) = %q, want %q", n, got, want)
		}
	}
}
