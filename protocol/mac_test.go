package protocol

import (
	"net"
	"strings"
	"testing"
)

func TestNormalizeMAC(t *testing.T) {
	for in, want := range map[string]string{
		"52:54:00:12:34:56":  "52:54:00:12:34:56",
		"52:54:00:AB:cd:EF":  "52:54:00:ab:cd:ef",
		"52-54-00-ab-cd-ef":  "52:54:00:ab:cd:ef",
		"5254.00ab.cdef":     "52:54:00:ab:cd:ef",
		" 52:54:00:ab:cd:ef": "52:54:00:ab:cd:ef",
	} {
		if got, err := NormalizeMAC(in); err != nil || got != want {
			t.Errorf("NormalizeMAC(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "52:54:00:12:34", "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01", "zz:54:00:12:34:56", "m_x", "52:54-00:12:34:56", "525400123456", "5254.00ab.cdeg", "52:54:00:12:34:5"} {
		if _, err := NormalizeMAC(bad); err == nil {
			t.Errorf("NormalizeMAC(%q) accepted", bad)
		}
	}
}

func FuzzNormalizeMAC(f *testing.F) {
	for _, s := range []string{"52:54:00:12:34:56", "52-54-00-AB-CD-EF", "5254.00ab.cdef", "", "::::::"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := NormalizeMAC(s)
		if err != nil {
			return
		}
		if len(m) != 17 || strings.ToLower(m) != m {
			t.Fatalf("%q normalised to %q", s, m)
		}
		// Never wider than net.ParseMAC's grammar: what bcd accepts, Go's own
		// parser reads as the same address.
		if hw, err := net.ParseMAC(strings.TrimSpace(s)); err != nil || hw.String() != m {
			t.Fatalf("%q: net.ParseMAC says %v %v, bcd says %q", s, hw, err, m)
		}
		if again, err := NormalizeMAC(m); err != nil || again != m {
			t.Fatalf("%q is not stable: %q %v", m, again, err)
		}
	})
}
