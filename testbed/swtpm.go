package testbed

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/pki/tpmattest"
)

// ReadSWTPMEK reads the endorsement key of the TPM whose swtpm state is in
// state (made there if it is empty) and returns its sha256 (tpmattest.EKSHA256),
// what an operator enrolls. It starts swtpm on that state with its command port
// on loopback, reads the EK as bcd does (agent/tpm), and stops it; a VM's swtpm
// on the same state then has the same EK, its seeds being in the state.
func ReadSWTPMEK(state string) (string, error) {
	if err := os.MkdirAll(state, 0o700); err != nil {
		return "", err
	}
	port, err := freeLoopbackPort()
	if err != nil {
		return "", err
	}
	ctrl, err := freeLoopbackPort()
	if err != nil {
		return "", err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := StartProcess("swtpm (EK)", exec.Command("swtpm", "socket", "--tpm2", "--tpmstate", "dir="+state,
		"--server", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", port),
		"--ctrl", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", ctrl),
		"--flags", "not-need-init,startup-clear"), filepath.Join(filepath.Dir(state), filepath.Base(state)+"-ek.log"))
	if err != nil {
		return "", err
	}
	defer p.Stop(5 * time.Second)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("testbed: swtpm on %s does not listen on %s:\n%s", state, addr, p.Tail(20))
		}
	}
	t, err := tpm.OpenTCP(addr)
	if err != nil {
		return "", err
	}
	ek, err := t.EK()
	t.Close() // swtpm serves one client at a time
	if err != nil {
		return "", fmt.Errorf("testbed: the EK of swtpm on %s: %w", state, err)
	}
	return tpmattest.EKSHA256(ek.PKIX), nil
}

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
