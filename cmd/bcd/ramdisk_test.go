package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/ramdisk"
)

func TestRamdiskParameterErrorsExit2(t *testing.T) {
	pins := testBundle.Public.Pins()
	full := map[string]string{
		protocol.CmdlineGatewayURL:        "https://gw.example.com",
		protocol.CmdlineServerName:        "gw.example.com",
		protocol.CmdlineSite:              "fsn1",
		protocol.CmdlineServingCAPin:      pins.ServingCA,
		protocol.CmdlineJoinSigningPin:    pins.JoinSigning,
		protocol.CmdlineJoinEncryptionPin: pins.JoinEncryption,
		protocol.CmdlineBootNonce:         "Jq2c0wXy1bLr4TUVnKZ8g0pD7sHfQe3m5a9RtYuIoP_",
	}
	write := func(t *testing.T, skip, override string) string {
		words := []string{"console=ttyS0"}
		for k, v := range full {
			switch k {
			case skip:
				continue
			case override:
				v = "bad value"
				words = append(words, k+`="`+v+`"`)
				continue
			}
			words = append(words, k+"="+v)
		}
		p := filepath.Join(t.TempDir(), "cmdline")
		if err := os.WriteFile(p, []byte(strings.Join(words, " ")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for name := range full {
		t.Run("missing "+name, func(t *testing.T) {
			code, stdout, stderr := runBcdIn(t, "", "ramdisk", "--cmdline", write(t, name, ""))
			want := "bcd ramdisk: kernel parameter " + name + " is missing"
			if code != 2 || !strings.HasPrefix(stderr, want) || stdout != "" {
				t.Fatalf("exit %d, stderr %q, want 2 and %q", code, stderr, want)
			}
			if strings.Count(stderr, "kernel parameter") != 1 {
				t.Fatalf("stderr names more than the missing parameter: %q", stderr)
			}
		})
		t.Run("malformed "+name, func(t *testing.T) {
			code, _, stderr := runBcdIn(t, "", "ramdisk", "--cmdline", write(t, "", name))
			if code != 2 || !strings.HasPrefix(stderr, "bcd ramdisk: kernel parameter "+name+" ") {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			if strings.Contains(stderr, full[protocol.CmdlineBootNonce]) {
				t.Fatal("the message repeats the nonce")
			}
		})
	}
	code, _, stderr := runBcdIn(t, "", "ramdisk", "--cmdline", filepath.Join(t.TempDir(), "none"))
	if code != 1 || !strings.Contains(stderr, "read the kernel command line") {
		t.Fatalf("unreadable command line: exit %d, %q", code, stderr)
	}
	code, _, stderr = runBcdIn(t, "", "ramdisk", "bcd.site=x")
	if code != 2 || strings.Contains(stderr, "bcd.site=x") {
		t.Fatalf("positional argument: exit %d, %q", code, stderr)
	}
}

type readySystem struct{}

func (readySystem) Prepare(context.Context, *slog.Logger) error { return nil }
func (readySystem) Network(context.Context, *slog.Logger) error { return nil }

type offMachine struct{ off chan struct{} }

func (offMachine) KexecLoad(k, i *os.File, c string) error { return errors.New("not in this test") }
func (offMachine) KexecExec() error                        { return errors.New("not in this test") }
func (offMachine) Reboot() error                           { return errors.New("not in this test") }
func (m offMachine) PowerOff() error                       { close(m.off); return nil }

// TestRamdiskRunsUntilPoweredOff runs bcd ramdisk through run() against a fake
// gateway: the discovery join, a session, and a machine.poweroff that ends it.
func TestRamdiskRunsUntilPoweredOff(t *testing.T) {
	g := agenttest.NewFromBundle(t, testBundle)
	const nonce = "Jq2c0wXy1bLr4TUVnKZ8g0pD7sHfQe3m5a9RtYuIoP_"
	g.Nonces[nonce] = agenttest.Nonce{MAC: "52:54:00:aa:bb:cc", Site: "fsn1"}
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "off1", Kind: protocol.KindMachineOff})
		agenttest.AckAll(ctx, c, nil)
	}
	p := g.Pins
	cmdline := strings.Join([]string{"console=ttyS0",
		"bcd.gateway_url=" + g.URL, "bcd.server_name=127.0.0.1", "bcd.site=fsn1",
		"bcd.serving_ca_pin=" + p.ServingCA, "bcd.join_signing_pin=" + p.JoinSigning,
		"bcd.join_encryption_pin=" + p.JoinEncryption, "bcd.boot_nonce=" + nonce}, " ")
	path := filepath.Join(t.TempDir(), "cmdline")
	if err := os.WriteFile(path, []byte(cmdline), 0o644); err != nil {
		t.Fatal(err)
	}
	m := offMachine{off: make(chan struct{})}
	ramdiskHooks = func(a *ramdisk.Agent) {
		a.DataDir = filepath.Join(t.TempDir(), "run-bcd")
		a.System = readySystem{}
		a.Machine = m
		a.Claims = func(context.Context) protocol.Claims { return protocol.Claims{MACs: []string{"52:54:00:aa:bb:cc"}} }
		a.BootID = func() (string, error) { return "boot-1", nil }
		a.FlushTimeout = 5 * time.Second
	}
	defer func() { ramdiskHooks = nil }()
	code, _, stderr := runBcdIn(t, "", "ramdisk", "--cmdline", path)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	select {
	case <-m.off:
	default:
		t.Fatal("not powered off")
	}
	if !strings.Contains(stderr, `"msg":"bcd ramdisk starting"`) || !strings.Contains(stderr, `"msg":"joined"`) {
		t.Fatalf("console:\n%s", stderr)
	}
	if strings.Contains(stderr, nonce) {
		t.Fatal("the console shows the nonce")
	}
}
