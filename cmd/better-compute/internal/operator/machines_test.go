package operator

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/protocol"
)

// fakeSite is a site agent's session that answers every bmc.* command with
// the state answer returns, as the real agent would after driving the BMC.
type fakeSite struct {
	mu       sync.Mutex
	commands []protocol.Command
	answer   func(protocol.Command) protocol.Status
}

func (f *fakeSite) got() []protocol.Command {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]protocol.Command(nil), f.commands...)
}

func (f *fakeSite) setAnswer(a func(protocol.Command) protocol.Status) {
	f.mu.Lock()
	f.answer = a
	f.mu.Unlock()
}

// startFakeSite joins a site agent of site through the gateway and runs
// its session until the test ends.
func startFakeSite(t *testing.T, s *controlplane.Server, site string) *fakeSite {
	t.Helper()
	c, err := client.New(s.APIURL(), os.Getenv(envToken), s.Bundle().Public.ServingCAPool())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := c.CreateToken(context.Background(), apitype.TokenCreate{Pool: "sites", Site: site, Role: protocol.RoleSite})
	if err != nil {
		t.Fatal(err)
	}
	roots := s.Bundle().Public.ServingCAPool()
	a := cptest.NewAgent(t)
	jr, er := cptest.PostJoin(t, cptest.HTTPClient(roots, nil), s.AdvertisedGatewayURL(), a.Request(t, s.Bundle(), protocol.RoleSite, tok.Token, nil))
	if er != nil {
		t.Fatalf("site join: %+v", er)
	}
	sess := a.Dial(t, s.AdvertisedGatewayURL(), roots, a.Verify(t, s.Bundle(), jr))
	f := &fakeSite{answer: func(c protocol.Command) protocol.Status {
		var p protocol.BMCPowerParams
		json.Unmarshal(c.Params, &p)
		res, _ := json.Marshal(protocol.BMCPowerResult{Machine: p.Machine, Action: p.Action, Power: protocol.PowerStateOn})
		return protocol.Status{State: protocol.StateSucceeded, Result: res}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		var seq uint64
		for {
			fr, err := sess.Read(ctx)
			if err != nil {
				return
			}
			if fr.Type != protocol.FrameCommand {
				continue
			}
			var c protocol.Command
			if fr.Decode(&c) != nil {
				return
			}
			f.mu.Lock()
			f.commands = append(f.commands, c)
			st := f.answer(c)
			f.mu.Unlock()
			seq++
			st.Seq, st.CommandID, st.Time = seq, c.ID, time.Now()
			if sess.Write(protocol.FrameStatus, st) != nil {
				return
			}
		}
	}()
	// The session is registered once its Welcome is out; the store says
	// connected a moment later.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		nodes, _ := c.ListNodes(context.Background())
		for _, n := range nodes {
			if n.Role == protocol.RoleSite && n.Connected {
				return f
			}
		}
	}
	t.Fatal("the fake site agent's session is not seen")
	return nil
}

func writeSecret(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, mode)
	return path
}

func TestMachinesCLI(t *testing.T) {
	s, _ := controlPlane(t)
	t.Setenv(envBMCPassword, "")
	if code, out, errOut := runCLI(t, "", "sites", "create", "fsn1"); code != 0 || !strings.Contains(out, "approval auto") {
		t.Fatalf("sites create: %d %s %s", code, out, errOut)
	}
	if code, out, _ := runCLI(t, "", "sites", "create", "man1", "--approve", "manual"); code != 0 || !strings.Contains(out, "approval manual") {
		t.Errorf("sites create --approve manual: %d %s", code, out)
	}
	if code, _, _ := runCLI(t, "", "sites", "create", "x1", "--approve", "maybe"); code != 2 {
		t.Errorf("--approve maybe: exit %d", code)
	}
	if code, out, errOut := runCLI(t, "", "sites", "set-proxy", "fsn1", "--listen", "10.20.0.2:3128", "--allow", "images.example.test:443"); code != 0 || !strings.Contains(out, "10.20.0.2:3128") {
		t.Errorf("set-proxy: %d %s %s", code, out, errOut)
	}
	if code, out, _ := runCLI(t, "", "sites", "list"); code != 0 || !regexp.MustCompile(`fsn1\s+auto\s+10\.20\.0\.2:3128`).MatchString(out) || !regexp.MustCompile(`man1\s+manual\s+-`).MatchString(out) {
		t.Errorf("sites list: %d\n%s", code, out)
	}

	// The BMC password: from a 0600 file or the environment, never argv.
	loose := writeSecret(t, "calvin\n", 0o644)
	code, _, errOut := runCLI(t, "", "machines", "add", "--site", "fsn1", "--mac", "52:54:00:12:34:56", "--bmc-address", "10.0.0.5", "--bmc-user", "root", "--bmc-password-file", loose)
	if code != 1 || !strings.Contains(errOut, "chmod 600") || strings.Contains(errOut, "calvin") {
		t.Errorf("0644 password file: %d %s", code, errOut)
	}
	code, out, errOut := runCLI(t, "", "machines", "add", "--site", "fsn1", "--mac", "52:54:00:12:34:56", "--bmc-address", "10.0.0.5", "--bmc-password=calvin")
	if code != 2 || strings.Contains(out+errOut, "calvin") {
		t.Errorf("--bmc-password on the command line: %d %s %s", code, out, errOut)
	}
	pwFile := writeSecret(t, "calvin\n", 0o600)
	code, out, errOut = runCLI(t, "", "machines", "add", "--site", "fsn1", "--mac", "52:54:00:12:34:56", "--mac", "52-54-00-12-34-57", "--name", "r1u1",
		"--bmc-address", "10.0.0.5", "--bmc-user", "root", "--bmc-password-file", pwFile, "--bmc-cipher-suite", "3")
	if code != 0 || !regexp.MustCompile(`^machine m_[0-9a-z]{26} added to site fsn1 \(52:54:00:12:34:56, 52:54:00:12:34:57\)\n$`).MatchString(out) {
		t.Fatalf("machines add: %d %q %s", code, out, errOut)
	}
	id := strings.Fields(out)[1]
	t.Setenv(envBMCPassword, "from-env")
	if code, out, errOut = runCLI(t, "", "machines", "add", "--site", "fsn1", "--mac", "52:54:00:00:00:99", "--bmc-address", "10.0.0.6", "--bmc-user", "root", "--efi"); code != 0 {
		t.Errorf("machines add with the password in the environment: %d %s", code, errOut)
	}
	t.Setenv(envBMCPassword, "")
	if m, err := s.Store().FindMachineByMAC(context.Background(), "52:54:00:00:00:99"); err != nil || m.BMC == nil || m.BMC.Password != "from-env" || m.Firmware != "uefi" {
		t.Errorf("environment password: %+v %v", m.BMC, err)
	}
	if code, _, errOut = runCLI(t, "", "machines", "add", "--site", "fsn1", "--mac", "52:54:00:12:34:56"); code != 1 || !strings.Contains(errOut, "ALREADY_EXISTS") || !strings.Contains(errOut, id) {
		t.Errorf("MAC taken: %d %s", code, errOut)
	}
	if code, _, _ = runCLI(t, "", "machines", "add", "--site", "fsn1"); code != 2 {
		t.Errorf("add without --mac: exit %d", code)
	}

	code, out, _ = runCLI(t, "", "machines", "list")
	for _, col := range []string{"ID", "NAME", "SITE", "MAC", "BOOT", "STATE", "LAST BOOT EVENT", "RAMDISK NODE", id, "r1u1", "52:54:00:12:34:56 (+1)", "registered"} {
		if !strings.Contains(out, col) {
			t.Errorf("machines list lacks %q:\n%s", col, out)
		}
	}
	code, out, _ = runCLI(t, "", "machines", "list", "-o", "json")
	var list []apitype.MachineInfo
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 2 || strings.Contains(out, "calvin") {
		t.Errorf("machines list -o json: %d %s", code, out)
	}
	for _, ref := range []string{"r1u1", id, "52:54:00:12:34:57"} {
		code, out, _ = runCLI(t, "", "machines", "show", ref)
		if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "password set") || !strings.Contains(out, "cipher suite 3") || strings.Contains(out, "calvin") {
			t.Errorf("machines show %s: %d\n%s", ref, code, out)
		}
	}
	if code, out, _ = runCLI(t, "", "machines", "boot", "r1u1", "ramdisk"); code != 0 || !strings.Contains(out, "boots ramdisk") {
		t.Errorf("machines boot: %d %s", code, out)
	}
	if code, _, _ = runCLI(t, "", "machines", "boot", "r1u1", "floppy"); code != 2 {
		t.Errorf("machines boot floppy: exit %d", code)
	}

	// BMC commands need a connected site agent.
	if code, _, errOut = runCLI(t, "", "machines", "power", "r1u1", "status"); code != 1 || !strings.Contains(errOut, "no site agent") {
		t.Errorf("power without a site agent: %d %s", code, errOut)
	}
	site := startFakeSite(t, s, "fsn1")
	code, out, errOut = runCLI(t, "", "machines", "power", "r1u1", "cycle")
	if code != 0 || out != "machine "+id+": cycle done, power is on\n" {
		t.Errorf("power cycle: %d %q %s", code, out, errOut)
	}
	if got := site.got(); len(got) != 1 || got[0].Kind != protocol.KindBMCPower || !strings.Contains(string(got[0].Params), `"action":"cycle"`) {
		t.Errorf("site got %+v", got)
	}
	if code, out, _ = runCLI(t, "", "machines", "power", id, "status"); code != 0 || out != "machine "+id+": power is on\n" {
		t.Errorf("power status: %d %q", code, out)
	}
	site.setAnswer(func(c protocol.Command) protocol.Status {
		var p protocol.BMCBootdevParams
		json.Unmarshal(c.Params, &p)
		res, _ := json.Marshal(protocol.BMCBootdevResult{Machine: p.Machine, Device: p.Device, EFI: p.EFI, Persistent: p.Persistent})
		return protocol.Status{State: protocol.StateSucceeded, Result: res}
	})
	if code, out, errOut = runCLI(t, "", "machines", "bootdev", "r1u1", "pxe", "--efi"); code != 0 || out != "machine "+id+" boots from pxe (EFI, next boot only)\n" {
		t.Errorf("bootdev: %d %q %s", code, out, errOut)
	}
	site.setAnswer(func(protocol.Command) protocol.Status {
		return protocol.Status{State: protocol.StateFailed, Reason: protocol.ReasonBMCUnreachable, Message: "no answer from 10.0.0.5:623"}
	})
	code, _, errOut = runCLI(t, "", "machines", "power", "r1u1", "on")
	if code != 1 || !strings.Contains(errOut, "FAILED: BMCUnreachable: no answer from 10.0.0.5:623") {
		t.Errorf("a BMC failure: %d %s", code, errOut)
	}
	if code, out, _ = runCLI(t, "", "machines", "power", "r1u1", "off", "--wait=false"); code != 0 || !regexp.MustCompile(`^cmd_[0-9a-z]{26}\n$`).MatchString(out) {
		t.Errorf("--wait=false: %d %q", code, out)
	}
	if code, _, _ = runCLI(t, "", "machines", "power", "r1u1", "explode"); code != 2 {
		t.Errorf("power explode: exit %d", code)
	}

	code, out, _ = runCLI(t, "", "machines", "events", "r1u1")
	if code != 0 || strings.Count(out, "bmc.power") < 3 || !strings.Contains(out, protocol.MachineEventCommandStatus) || !strings.Contains(out, protocol.MachineEventBootMode) {
		t.Errorf("machines events: %d\n%s", code, out)
	}

	// machines deploy starts the lifecycle, which drives the BMC through the
	// site agent: it answers FAILED, the bootdev is sent once more, then the
	// machine is failed with the BMC's reason.
	deploy := []string{"machines", "deploy", "r1u1", "--image", "https://images.example.test/os.raw", "--sha256", strings.Repeat("a", 64), "--size", "4096"}
	code, out, errOut = runCLI(t, "", append(deploy, "--wait", "--timeout", "30s")...)
	why := "bmc.bootdev pxe FAILED: BMCUnreachable: no answer from 10.0.0.5:623"
	if code != 1 || !strings.Contains(errOut, "pxe-booting: deploying https://images.example.test/os.raw") ||
		!strings.Contains(errOut, "machine "+id+" failed: "+why) {
		t.Errorf("deploy --wait with a failing BMC: %d %s %s", code, out, errOut)
	}
	if code, out, _ = runCLI(t, "", "machines", "list"); code != 0 || !strings.Contains(out, "failed: "+why) {
		t.Errorf("machines list after the failure: %d\n%s", code, out)
	}
	code, out, _ = runCLI(t, "", "machines", "events", "r1u1", "-o", "json")
	var evs apitype.MachineEventList
	if code != 0 || json.Unmarshal([]byte(out), &evs) != nil || evs.Machine != id {
		t.Fatalf("machines events -o json: %d %s", code, out)
	}
	var states []string
	for _, e := range evs.Events {
		if e.Kind == protocol.MachineEventState {
			states = append(states, e.Message)
		}
	}
	if len(states) != 2 || !strings.HasPrefix(states[0], "pxe-booting: ") || states[1] != "failed: "+why {
		t.Errorf("states on the timeline: %q", states)
	}
	// A failed machine deploys again; a running deployment refuses another
	// until it is cancelled.
	site.setAnswer(func(c protocol.Command) protocol.Status { return protocol.Status{State: protocol.StateSucceeded} })
	code, out, errOut = runCLI(t, "", deploy...)
	if code != 0 || !regexp.MustCompile(`^dep_[0-9a-z]{26}\n$`).MatchString(out) || !strings.Contains(errOut, "pxe-booting") {
		t.Errorf("deploy again: %d %q %s", code, out, errOut)
	}
	if code, _, errOut = runCLI(t, "", deploy...); code != 1 || !strings.Contains(errOut, "ALREADY_EXISTS") || !strings.Contains(errOut, "machines cancel") {
		t.Errorf("deploy while deploying: %d %s", code, errOut)
	}
	// While it deploys, the machine is the lifecycle's: a spec change, a
	// manual BMC command and a delete are refused, naming the deployment;
	// an approval (which a deploy may wait for) is not.
	dep := strings.TrimSpace(out)
	busy := "machine " + id + " is pxe-booting (" + dep + "): cancel it first"
	for _, args := range [][]string{
		{"machines", "firmware", "r1u1", "uefi"},
		{"machines", "boot", "r1u1", "local"},
		{"machines", "set-bmc", "r1u1", "--clear"},
		{"machines", "power", "r1u1", "off"},
		{"machines", "bootdev", "r1u1", "disk"},
		{"machines", "delete", "r1u1", "--yes"},
	} {
		if code, _, errOut := runCLI(t, "", args...); code != 1 || !strings.Contains(errOut, "MACHINE_BUSY") || !strings.Contains(errOut, busy) {
			t.Errorf("%s during a deploy: exit %d, %s (want MACHINE_BUSY and %q)", strings.Join(args[:2], " "), code, errOut, busy)
		}
	}
	if code, out, _ = runCLI(t, "", "machines", "show", "r1u1"); code != 0 || !strings.Contains(out, "pxe-booting") || !strings.Contains(out, "FIRMWARE:") {
		t.Errorf("show after the refused changes: %d\n%s", code, out)
	}
	if code, out, errOut = runCLI(t, "", "machines", "cancel", "r1u1"); code != 0 || !strings.Contains(out, "cancelled; failed: cancelled by operator") {
		t.Errorf("cancel: %d %s %s", code, out, errOut)
	}
	if code, out, _ = runCLI(t, "", "machines", "show", "r1u1"); code != 0 || !strings.Contains(out, "failed: cancelled by operator") ||
		!strings.Contains(out, "ended cancelled") || !strings.Contains(out, "FIRMWARE:") {
		t.Errorf("show after cancel: %d\n%s", code, out)
	}
	if code, _, errOut = runCLI(t, "", "machines", "cancel", "r1u1"); code != 1 || !strings.Contains(errOut, "already ended") {
		t.Errorf("cancel again: %d %s", code, errOut)
	}
	if code, _, _ = runCLI(t, "", "machines", "deploy", "r1u1", "--image", "https://x/os.raw"); code != 2 {
		t.Errorf("deploy without --sha256: exit %d", code)
	}
	if code, _, _ = runCLI(t, "", append(deploy, "--after", "poweroff")...); code != 2 {
		t.Errorf("deploy --after poweroff: exit %d", code)
	}
	if code, out, _ = runCLI(t, "", "machines", "firmware", "r1u1", "uefi"); code != 0 || out != "machine "+id+": firmware uefi\n" {
		t.Errorf("firmware: %d %q", code, out)
	}
	if code, _, _ = runCLI(t, "", "machines", "firmware", "r1u1", "efi"); code != 2 {
		t.Errorf("firmware efi: exit %d", code)
	}
	if code, out, _ = runCLI(t, "", "machines", "approve", "r1u1"); code != 0 || !strings.Contains(out, "approved") {
		t.Errorf("approve: %d %s", code, out)
	}
	if code, out, errOut = runCLI(t, "", "machines", "set-bmc", "r1u1", "--bmc-address", "10.0.0.7", "--bmc-user", "admin"); code != 0 || !strings.Contains(out, "10.0.0.7") {
		t.Errorf("set-bmc: %d %s %s", code, out, errOut)
	}
	if m, _ := s.Store().GetMachine(context.Background(), id); m.BMC == nil || m.BMC.Password != "calvin" || m.BMC.Username != "admin" {
		t.Errorf("set-bmc kept %+v", m.BMC)
	}

	code, _, errOut = runCLI(t, "", "machines", "delete", "r1u1")
	if code != 2 || !strings.Contains(errOut, "would delete machine "+id) {
		t.Errorf("delete without --yes: %d %s", code, errOut)
	}
	if code, out, _ = runCLI(t, "", "machines", "delete", "r1u1", "--yes"); code != 0 || !strings.Contains(out, "deleted") {
		t.Errorf("delete: %d %s", code, out)
	}
	if code, _, errOut = runCLI(t, "", "machines", "show", "r1u1"); code != 1 || !strings.Contains(errOut, "NOT_FOUND") {
		t.Errorf("show a deleted machine: %d %s", code, errOut)
	}
}
