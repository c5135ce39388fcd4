package syncbuf

import (
	"strings"
	"testing"
)

func TestTailKeepsTheLastBytes(t *testing.T) {
	for _, c := range []struct {
		writes []string
		want   string
	}{
		{[]string{"abc"}, "abc"},
		{[]string{"abcdef", "gh"}, "cdefgh"},
		{[]string{strings.Repeat("x", 100), "end"}, "xxxend"},
	} {
		tb := &Tail{Max: 6}
		for _, w := range c.writes {
			if n, err := tb.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("Write(%q) = %d, %v", w, n, err)
			}
		}
		if got := tb.String(); got != c.want {
			t.Errorf("after %q: %q, want %q", c.writes, got, c.want)
		}
	}
}
