// Package swtpmtest starts swtpm, a real TPM 2.0 (libtpms), on loopback for
// tests: the node key, the attestor and the e2e join all run against it. A
// missing swtpm skips the test (internal/testenv), which BCD_REQUIRE_ALL=1 turns
// into a failure.
package swtpmtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// SWTPM is a software TPM 2.0 (libtpms) that a test started on loopback.
type SWTPM struct {
	t      *testing.T
	bin    string
	state  string
	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start starts swtpm with a fresh state directory. With ekCert the state is
// first manufactured by swtpm_setup with an EK certificate in NV (index 0x01c00002),
// signed by a local CA made in a temporary directory.
func Start(t *testing.T, ekCert bool) *SWTPM {
	t.Helper()
	bin := testenv.NeedTool(t, "swtpm")
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if ekCert {
		setup := testenv.NeedTool(t, "swtpm_setup")
		localcaBin := testenv.NeedTool(t, "swtpm_localca")
		ca := filepath.Join(dir, "ca")
		if err := os.Mkdir(ca, 0o700); err != nil {
			t.Fatal(err)
		}
		localca := filepath.Join(dir, "localca.conf")
		writeFile(t, localca, fmt.Sprintf("statedir = %[1]s\nsigningkey = %[1]s/signkey.pem\nissuercert = %[1]s/issuercert.pem\ncertserial = %[1]s/certserial\n", ca))
		opts := filepath.Join(dir, "localca.options")
		writeFile(t, opts, "--platform-manufacturer bcd\n--platform-version 1\n--platform-model test\n")
		conf := filepath.Join(dir, "setup.conf")
		writeFile(t, conf, fmt.Sprintf("create_certs_tool = %s\ncreate_certs_tool_config = %s\ncreate_certs_tool_options = %s\nactive_pcr_banks = sha256\n", localcaBin, localca, opts))
		out, err := exec.Command(setup, "--tpm2", "--tpmstate", state, "--config", conf,
			"--create-ek-cert", "--create-platform-cert", "--overwrite").CombinedOutput()
		if err != nil {
			t.Fatalf("swtpm_setup: %v\n%s", err, out)
		}
	}
	s := &SWTPM{t: t, bin: bin, state: state}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// freePort returns a loopback port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (s *SWTPM) start() {
	t := s.t
	t.Helper()
	for attempt := 0; ; attempt++ {
		port, ctrl := freePort(t), freePort(t)
		cmd := exec.Command(s.bin, "socket", "--tpm2",
			"--server", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", port),
			"--ctrl", fmt.Sprintf("type=tcp,port=%d,bindaddr=127.0.0.1", ctrl),
			"--tpmstate", "dir="+s.state,
			"--flags", "not-need-init,startup-clear")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting swtpm: %v", err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if s.wait(addr, exited) {
			s.addr, s.cmd, s.exited = addr, cmd, exited
			return
		}
		cmd.Process.Kill()
		<-exited
		if attempt == 3 {
			t.Fatal("swtpm did not listen within 10s")
		}
	}
}

// wait waits until swtpm listens on addr, or exits.
func (s *SWTPM) wait(addr string, exited chan struct{}) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-exited:
			return false // most likely a port taken in between
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// Stop kills swtpm by its PID and waits for it; its state stays in s.state.
func (s *SWTPM) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart stops swtpm and starts it again on the same state directory, as a reboot
// would: transient objects are gone, the hierarchies' seeds are not.
func (s *SWTPM) Restart() {
	s.Stop()
	s.start()
}

// Addr is swtpm's TCP command port (tpm.OpenTCP, nodekey.EnvTPMTCP).
func (s *SWTPM) Addr() string { return s.addr }
