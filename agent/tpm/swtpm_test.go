package tpm

import (
	"testing"

	"github.com/better-compute/bcd/internal/swtpmtest"
)

// sw is a swtpm the test started, with what these tests do to it.
type sw struct {
	*swtpmtest.SWTPM
	t *testing.T
}

func startSwtpm(t *testing.T, ekCert bool) sw { return sw{swtpmtest.Start(t, ekCert), t} }

// open opens the running swtpm.
func (s sw) open() *TPM {
	s.t.Helper()
	tp, err := OpenTCP(s.Addr())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { tp.Close() })
	return tp
}

func (s sw) restart() { s.Restart() }
