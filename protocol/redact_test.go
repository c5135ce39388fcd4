package protocol

import "testing"

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://u:p@images.example.test/a.raw?sig=x#f", "https://images.example.test/a.raw"},
		{"https://images.example.test/a.raw", "https://images.example.test/a.raw"},
		{"http://10.0.0.1:8080/x%20y.img?X-Amz-Signature=s", "http://10.0.0.1:8080/x%20y.img"},
		{"", ""},
		{"http://[::1", "(unparsable URL)"},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
