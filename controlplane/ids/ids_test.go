package ids

import (
	"sort"
	"testing"
	"time"

	"github.com/better-compute/bcd/protocol"
)

func TestNewIsValidAndSorts(t *testing.T) {
	base := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	var got []string
	for i := 0; i < 50; i++ {
		id := New(PrefixNode, base.Add(time.Duration(i)*time.Millisecond))
		if !Valid(PrefixNode, id) {
			t.Fatalf("New gave %q, which Valid refuses", id)
		}
		if !protocol.ValidNodeID(id) {
			t.Fatalf("node id %q is not a protocol.ValidNodeID", id)
		}
		got = append(got, id)
	}
	if !sort.StringsAreSorted(got) {
		t.Errorf("ids minted in time order do not sort: %v", got)
	}
}

func TestValid(t *testing.T) {
	good := New(PrefixToken, time.Now())
	for _, tc := range []struct {
		s    string
		want bool
	}{
		{good, true},
		{good[:len(good)-1], false},
		{good + "0", false},
		{"n_" + good[3:], false},
		{PrefixToken + "8" + good[4:], false},
		{PrefixToken + "u" + good[4:], false},
		{PrefixToken + "0" + "ABCDEFGHJKMNPQRSTVWXYZ012", false},
	} {
		if got := Valid(PrefixToken, tc.s); got != tc.want {
			t.Errorf("Valid(%q) = %v, want %v", tc.s, got, tc.want)
		}
	}
}
