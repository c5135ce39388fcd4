package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/pki"
)

// TestMain lets a test run this package's main in a child process, so
// `serve` can be stopped with a real signal.
func TestMain(m *testing.M) {
	if os.Getenv("BETTER_COMPUTE_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// runCLI runs better-compute with args and returns its exit code and output.
func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

// bcopRE is an operator token as serve prints it once.
var bcopRE = regexp.MustCompile(`bcop_[a-z2-7]{52}`)

// serveChild starts `better-compute serve` with args and returns the lines it
// prints until both listeners are up.
func serveChild(t *testing.T, args ...string) (*exec.Cmd, []string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"serve"}, args...)...)
	cmd.Env = append(os.Environ(), "BETTER_COMPUTE_TEST_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if testing.Verbose() == false {
		cmd.Stderr = nil
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var got []string
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("serve exited early; it printed %q", got)
			}
			got = append(got, l)
			if strings.HasPrefix(l, "gateway listening on ") {
				go func() {
					for range lines {
					}
				}()
				return cmd, got
			}
		case <-timeout:
			t.Fatalf("serve did not start; it printed %q", got)
		}
	}
}

func stop(t *testing.T, cmd *exec.Cmd, sig syscall.Signal) {
	t.Helper()
	cmd.Process.Signal(sig)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve after %v: %v, want exit 0", sig, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop on %v", sig)
	}
}

func TestServe(t *testing.T) {
	pkiDir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(pkiDir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(t.TempDir(), "data")
	args := []string{"--pki", pkiDir, "--data", data, "--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0"}
	cmd, lines := serveChild(t, args...)
	all := strings.Join(lines, "\n")
	if !regexp.MustCompile(`(?m)^api listening on https://127\.0\.0\.1:[1-9][0-9]*$`).MatchString(all) ||
		!regexp.MustCompile(`(?m)^gateway listening on https://127\.0\.0\.1:[1-9][0-9]*$`).MatchString(all) {
		t.Errorf("listener lines missing:\n%s", all)
	}
	if n := len(bcopRE.FindAllString(all, -1)); n != 1 {
		t.Errorf("first start printed %d operator tokens:\n%s", n, all)
	}
	stop(t, cmd, syscall.SIGTERM)

	cmd, lines = serveChild(t, args...)
	if bcopRE.MatchString(strings.Join(lines, "\n")) {
		t.Errorf("second start printed the operator token:\n%s", strings.Join(lines, "\n"))
	}
	stop(t, cmd, syscall.SIGINT)

	// --operator-token-file on a fresh data directory.
	file := filepath.Join(t.TempDir(), "operator-token")
	cmd, lines = serveChild(t, "--pki", pkiDir, "--data", filepath.Join(t.TempDir(), "data2"), "--listen", "127.0.0.1:0",
		"--gateway-listen", "127.0.0.1:0", "--operator-token-file", file)
	if bcopRE.MatchString(strings.Join(lines, "\n")) {
		t.Errorf("token printed although --operator-token-file was given")
	}
	fi, err := os.Stat(file)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("token file: %v, mode %v", err, fi.Mode().Perm())
	}
	stop(t, cmd, syscall.SIGTERM)
}

func TestServeUsage(t *testing.T) {
	if code, _, errOut := runCLI(t, "", "serve", "--data", t.TempDir()); code != 2 || !strings.Contains(errOut, "pki") {
		t.Errorf("serve without --pki: %d %s", code, errOut)
	}
	if code, _, _ := runCLI(t, "", "serve", "extra"); code != 2 {
		t.Errorf("serve with an argument: exit %d", code)
	}
	for _, tc := range []struct{ flag, want string }{
		{"--events-per-kind=-1", "--events-per-kind -1: want 0 (no bound) or more"},
		{"--events-max-age=-1h", "--events-max-age -1h0m0s: want 0 (no bound) or more"},
		{"--events-max-total=0", "--events-max-total 0: want at least 1"},
	} {
		code, _, errOut := runCLI(t, "", "serve", "--pki", t.TempDir(), "--data", t.TempDir(), tc.flag)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("serve %s: exit %d, %q; want 2 and %q", tc.flag, code, errOut, tc.want)
		}
	}
}
