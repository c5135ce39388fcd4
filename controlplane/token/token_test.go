package token

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestJoinRoundTrip(t *testing.T) {
	j := NewJoin(time.Now())
	if !strings.HasPrefix(j.Token, "bcjt_jt_") {
		t.Fatalf("token %q does not start with bcjt_jt_", j.Token)
	}
	id, h, err := ParseJoin(j.Token)
	if err != nil {
		t.Fatal(err)
	}
	if id != j.ID || !h.Equal(j.Hash) {
		t.Errorf("ParseJoin = %q, %x; want %q, %x", id, h, j.ID, j.Hash)
	}
	if strings.Contains(string(j.Hash[:]), j.Token) {
		t.Error("hash contains the token")
	}
}

func TestParseJoinRefuses(t *testing.T) {
	j := NewJoin(time.Now())
	op := NewOperator()
	for name, s := range map[string]string{
		"empty":        "",
		"operator":     op.Token,
		"no prefix":    strings.TrimPrefix(j.Token, "bcjt_"),
		"short":        j.Token[:len(j.Token)-1],
		"long":         j.Token + "a",
		"upper":        strings.ToUpper(j.Token),
		"bad sep":      strings.Replace(j.Token, "_", "-", 3),
		"padding":      j.Token[:len(j.Token)-1] + "=",
		"space":        j.Token + " ",
		"bad id":       "bcjt_jt_" + strings.Repeat("u", 26) + j.Token[len("bcjt_jt_")+26:],
		"non-base32 1": j.Token[:len(j.Token)-1] + "1",
	} {
		if _, _, err := ParseJoin(s); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: ParseJoin err = %v, want ErrMalformed", name, err)
		}
		if err := func() error { _, _, err := ParseJoin(s); return err }(); err != nil && s != "" && strings.Contains(err.Error(), s) {
			t.Errorf("%s: error quotes the token", name)
		}
	}
}

func TestOperatorRoundTrip(t *testing.T) {
	op := NewOperator()
	if !strings.HasPrefix(op.Token, "bcop_") {
		t.Fatalf("operator token %q does not start with bcop_", op.Token)
	}
	h, err := ParseOperator(op.Token)
	if err != nil || !h.Equal(op.Hash) {
		t.Fatalf("ParseOperator = %x, %v", h, err)
	}
	if _, err := ParseOperator(NewJoin(time.Now()).Token); !errors.Is(err, ErrMalformed) {
		t.Errorf("ParseOperator(join token) err = %v", err)
	}
	if NewOperator().Hash.Equal(op.Hash) {
		t.Error("two operator tokens share a hash")
	}
}

func FuzzParseJoin(f *testing.F) {
	f.Add(NewJoin(time.Now()).Token)
	f.Add("bcjt_")
	f.Add("bcjt_jt_00000000000000000000000000_" + strings.Repeat("a", 52))
	f.Fuzz(func(t *testing.T, s string) {
		id, h, err := ParseJoin(s)
		if err != nil {
			return
		}
		// A token that parses has one spelling: rebuilt from its parts it is s.
		_, secret, _ := strings.Cut(strings.TrimPrefix(s, "bcjt_"+id), "_")
		if "bcjt_"+id+"_"+secret != s {
			t.Fatalf("%q parsed to id %q", s, id)
		}
		_ = h
	})
}
