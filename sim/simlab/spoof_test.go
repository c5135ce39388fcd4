package simlab

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/join"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/ramdisk"
	"github.com/better-compute/bcd/testbed"
)

// The spoofing chain of issue 17 §1 with real binaries: better-compute serve
// and bcd site in the site's namespace, as the lab runs them with the
// neighbour check on, and two clients on the provisioning network, each in a
// namespace of its own on a macvlan of sim0 with its own MAC: the machine
// (victim, the MAC registered) and someone else on the VLAN (spoofer). Each
// client is this test binary run again in its namespace (spoofRole).
const (
	victimMAC  = "52:54:00:17:00:01"
	spoofMAC   = "02:00:00:17:00:66"
	victimAddr = "10.77.0.50"
	spoofAddr  = "10.77.0.66"
)

// spoofEnv names the role a re-run of the test binary plays, and its files.
const (
	spoofEnvRole = "BCD_SPOOF_ROLE"
	spoofEnvDir  = "BCD_SPOOF_DIR"
)

// spoofResult is what a client reports on stdout.
type spoofResult struct {
	ScriptStatus  int    `json:"script_status"`
	ScriptBody    string `json:"script_body"`
	WitnessError  string `json:"witness_error,omitempty"`
	JoinError     string `json:"join_error,omitempty"`
	JoinCode      string `json:"join_code,omitempty"`
	JoinedAs      string `json:"joined_as,omitempty"`
	UnwitnessCode string `json:"unwitnessed_code,omitempty"`
}

// spoofRole runs a client's part; true when the binary was run as one.
func spoofRole() bool {
	role := os.Getenv(spoofEnvRole)
	if role == "" {
		return false
	}
	res, err := runSpoofRole(role, os.Getenv(spoofEnvDir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
	os.Exit(0)
	return true
}

func runSpoofRole(role, dir string) (spoofResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var res spoofResult
	script := func() error {
		resp, err := http.Get("http://" + bootHTTP + "/ipxe/" + victimMAC + ".ipxe")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		res.ScriptStatus, res.ScriptBody = resp.StatusCode, string(b)
		return nil
	}
	stolen := filepath.Join(dir, "victim.ipxe")
	switch role {
	case "victim-script":
		// The machine PXE-boots; its script (and nonce) leaks, say from its
		// console, to the spoofer.
		if err := script(); err != nil {
			return res, err
		}
		return res, os.WriteFile(stolen, []byte(res.ScriptBody), 0o600)
	case "spoofer":
		if err := script(); err != nil {
			return res, err
		}
		b, err := os.ReadFile(stolen)
		if err != nil {
			return res, err
		}
		a, err := agentFromScript(string(b))
		if err != nil {
			return res, err
		}
		// With the stolen nonce: the site's witness, then the join without it.
		csr := make([]byte, 32)
		_, _ = rand.Read(csr)
		if _, err := a.AskWitness(ctx, hex.EncodeToString(csr)); err != nil {
			res.WitnessError = err.Error()
		}
		_, err = joinAs(ctx, a, nil)
		res.JoinError, res.JoinCode = refusal(err)
		return res, nil
	case "victim-join":
		// The machine's own ramdisk: a new boot, witnessed, joined.
		if err := script(); err != nil {
			return res, err
		}
		a, err := agentFromScript(res.ScriptBody)
		if err != nil {
			return res, err
		}
		id, err := joinAs(ctx, a, a.AskWitness)
		if err != nil {
			res.JoinError, res.JoinCode = refusal(err)
			return res, nil
		}
		res.JoinedAs = id
		return res, nil
	}
	return res, fmt.Errorf("unknown role %q", role)
}

func refusal(err error) (string, string) {
	if err == nil {
		return "", ""
	}
	var r *join.RefusedError
	if errors.As(err, &r) {
		return err.Error(), r.Response.Code
	}
	return err.Error(), ""
}

// agentFromScript reads the ramdisk's parameters from an iPXE script's kernel
// line, as bcd ramdisk reads them from /proc/cmdline.
func agentFromScript(script string) (*ramdisk.Agent, error) {
	sc := bufio.NewScanner(strings.NewReader(script))
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "kernel ") {
			p, err := ramdisk.ParseParams(line, false)
			if err != nil {
				return nil, err
			}
			return &ramdisk.Agent{Params: p}, nil
		}
	}
	return nil, fmt.Errorf("no kernel line in the script:\n%s", script)
}

// joinAs runs the ramdisk's discovery join claiming the victim's MAC.
func joinAs(ctx context.Context, a *ramdisk.Agent, witness func(context.Context, string) (*protocol.BootWitness, error)) (string, error) {
	c := &join.Client{GatewayURL: a.Params.GatewayURL, ServerName: a.Params.ServerName, Pins: a.Params.Pins,
		Proxy: a.Params.Proxy, Witness: witness, GiveUpAfter: 30 * time.Second}
	id, _, err := c.Join(ctx, join.Request{Role: protocol.RoleRamdisk, Attestor: protocol.AttestorDiscovery,
		BootNonce: a.Params.BootNonce, Site: a.Params.Site, Claims: protocol.Claims{MACs: []string{victimMAC}, Hostname: "ramdisk"}})
	if err != nil {
		return "", err
	}
	return id.NodeID, nil
}

// TestSpoofedRamdiskRefused: a client on the VLAN that is not the machine gets
// no nonce for it (403), no witness for a nonce it stole, and its join with that
// nonce is refused NONCE_NOT_WITNESSED; both land on the machine's timeline.
// The machine's own ramdisk, on the MAC registered, still joins.
func TestSpoofedRamdiskRefused(t *testing.T) {
	l := newLabWith(t, 0, func(l *Lab) { l.CheckNeighbors = true })
	for _, c := range [][]string{
		{"machines", "add", "--site", siteName, "--name", "victim", "--mac", victimMAC},
		{"machines", "boot", "victim", "ramdisk"},
	} {
		if out, err := l.BC(c...); err != nil {
			t.Fatalf("better-compute %s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	id := os.Getpid() % 100000
	dir := t.TempDir()
	client := func(name, mac, addr string) *testbed.Netns {
		ns, err := testbed.NewNetns(fmt.Sprintf("bcd%s%d", name, id))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Close() })
		for _, c := range [][]string{
			{"link", "add", "link", "sim0", "name", "mv" + name, "address", mac, "type", "macvlan", "mode", "bridge"},
			{"link", "set", "mv" + name, "netns", ns.Name},
		} {
			if err := l.simNS.Run("ip", c...); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range [][]string{
			{"addr", "add", fmt.Sprintf("%s/%d", addr, prefixLen), "dev", "mv" + name},
			{"link", "set", "mv" + name, "up"},
		} {
			if err := ns.Run("ip", c...); err != nil {
				t.Fatal(err)
			}
		}
		return ns
	}
	victim := client("victim", victimMAC, victimAddr)
	spoofer := client("spoof", spoofMAC, spoofAddr)
	run := func(ns *testbed.Netns, role string) spoofResult {
		t.Helper()
		exe, _ := os.Executable()
		cmd := ns.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), spoofEnvRole+"="+role, spoofEnvDir+"="+dir)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var res spoofResult
		if err != nil || json.Unmarshal(out, &res) != nil {
			t.Fatalf("%s: %v\n%s\n%s\n%s", role, err, out, stderr.String(), l.Diagnostics())
		}
		return res
	}

	// The site has the machine's boot entry once the control plane's spec
	// reached it: until then the script is the unknown machine's.
	var res spoofResult
	deadline := time.Now().Add(time.Minute)
	for res = run(victim, "victim-script"); !strings.Contains(res.ScriptBody, "bcd.boot_nonce="); res = run(victim, "victim-script") {
		if time.Now().After(deadline) {
			t.Fatalf("the machine's own script: %d %s", res.ScriptStatus, res.ScriptBody)
		}
		time.Sleep(500 * time.Millisecond)
	}

	s := run(spoofer, "spoofer")
	if s.ScriptStatus != http.StatusForbidden || strings.Contains(s.ScriptBody, "bcd.boot_nonce=") ||
		!strings.Contains(s.ScriptBody, spoofAddr+" is "+spoofMAC+" in the neighbour table, not "+victimMAC) {
		t.Errorf("the spoofer's script: %d %s", s.ScriptStatus, s.ScriptBody)
	}
	if !strings.Contains(s.WitnessError, "refused to witness") || !strings.Contains(s.WitnessError, "403") {
		t.Errorf("the spoofer's witness: %q, want the site's refusal", s.WitnessError)
	}
	if s.JoinCode != protocol.CodeNonceNotWitnessed {
		t.Errorf("the spoofer's join: %s (%s), want %s", s.JoinError, s.JoinCode, protocol.CodeNonceNotWitnessed)
	}

	// The machine's timeline shows both: the site's refusal (through its
	// session) and the control plane's.
	var events string
	deadline = time.Now().Add(30 * time.Second)
	for {
		out, err := l.BC("machines", "events", "victim", "-o", "json")
		if err != nil {
			t.Fatalf("machines events: %v\n%s", err, out)
		}
		events = out
		if strings.Contains(events, `"`+protocol.EventBootRefused+`"`) && strings.Contains(events, protocol.CodeNonceNotWitnessed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the timeline has no %s and %s refusal:\n%s", protocol.EventBootRefused, protocol.CodeNonceNotWitnessed, events)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if !strings.Contains(events, spoofAddr) || !strings.Contains(events, spoofMAC) {
		t.Errorf("the timeline's boot.refused does not name the spoofer's address and MAC:\n%s", events)
	}

	// The machine itself: a new boot, the site's witness, joined.
	v := run(victim, "victim-join")
	if v.JoinedAs == "" {
		t.Fatalf("the machine's own join: %s (%s)\n%s", v.JoinError, v.JoinCode, l.Diagnostics())
	}
	t.Logf("the machine's ramdisk joined as %s; the spoofer got %d, %q and %s", v.JoinedAs, s.ScriptStatus, s.WitnessError, s.JoinCode)
}
