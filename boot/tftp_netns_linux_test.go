package boot

import (
	"bytes"
	"os"
	"os/exec"
	"testing"

	"github.com/better-compute/bcd/internal/testenv"
)

// TestTFTPListenInANamespace: a server that Listen opened inside a network namespace
// serves from there even when Serve runs on the caller's own threads, as the testbed
// runs it. The server opens a socket per transfer, which must land in the namespace
// too.
func TestTFTPListenInANamespace(t *testing.T) {
	curl := testenv.NeedTool(t, "curl")
	ns := newNetns(t, "t")
	root, files := tftpRoot(t)
	s := &TFTPServer{Addr: "127.0.0.1:69", Root: root}
	if err := ns.do(t, s.Listen); err != nil {
		t.Fatalf("Listen in the namespace: %v", err)
	}
	ctx := t.Context()
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	out := t.TempDir() + "/got"
	b, err := exec.Command("ip", "netns", "exec", string(ns), curl, "-sS", "--fail", "--max-time", "20", "--tftp-blksize", "1468",
		"-o", out, "tftp://127.0.0.1/undionly.kpxe").CombinedOutput()
	if err != nil {
		t.Fatalf("curl in the namespace: %v: %s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil || !bytes.Equal(got, files["undionly.kpxe"]) {
		t.Errorf("got %d bytes (%v), want the %d-byte file", len(got), err, len(files["undionly.kpxe"]))
	}
}
