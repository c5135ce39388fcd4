package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/protocol"
)

// certLifetime is the control plane's certificate lifetime in these tests: a node
// renews two thirds into it, at about 2 minutes.
const certLifetime = "3m"

// fakeBcd is bcd built with the fakehw tag (TestMain builds it), the only
// build that honours BCD_TEST_RENEWAL_STOP.
func fakeBcd(t *testing.T) string {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bcdFakeBin
}

// status reads bcd node's status socket.
func status(t *testing.T, h host) (agent.SessionStatus, error) {
	t.Helper()
	sock := filepath.Join(h.dir, "bcd.sock")
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	defer c.CloseIdleConnections()
	var st agent.SessionStatus
	resp, err := c.Get("http://bcd/v1/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// joinedNode joins a node of site fsn1 to cp with bin and returns its host and id.
func joinedNode(t *testing.T, cp *controlPlane, bin string) (host, string) {
	t.Helper()
	cp.mustBC("sites", "create", "fsn1")
	tok := cp.token("fsn1", "node")
	h := newHost(t, cp, "fsn1")
	cmd := exec.Command(bin, "join", "--config", h.config)
	cmd.Env = append(os.Environ(), "BCD_JOIN_TOKEN="+tok)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bcd join: %v\n%s\nserve log:\n%s", err, out, cp.log)
	}
	return h, identityNodeID(t, h.data)
}

func (cp *controlPlane) node(t *testing.T, id string) nodeRow {
	t.Helper()
	for _, n := range cp.nodes() {
		if n.ID == id {
			return n
		}
	}
	t.Fatalf("node %s is not in nodes list", id)
	return nodeRow{}
}

// TestRenewalKeepsTheSession: with 3-minute certificates a node renews twice
// while its session stays up: nodes list and the status socket show the expiry
// move on twice, and the session (its id) never ends.
func TestRenewalKeepsTheSession(t *testing.T) {
	t.Parallel()
	cp := newControlPlane(t, "--cert-lifetime", certLifetime)
	h, id := joinedNode(t, cp, bcdBin)
	node := startAgent(t, "node", "--config", h.config)
	n := cp.waitNode(id, 60*time.Second, "ready and connected", func(n nodeRow) bool { return n.State == protocol.NodeReady && n.Connected })
	session := n.SessionID
	expiries := []time.Time{n.CertNotAfter}
	deadline := time.Now().Add(6 * time.Minute)
	for len(expiries) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d renewals within 6 minutes (expiries %v)\nnode log:\n%s\nserve log:\n%s", len(expiries)-1, expiries, node.log, cp.log)
		}
		time.Sleep(2 * time.Second)
		n := cp.node(t, id)
		if !n.Connected || n.SessionID != session {
			t.Fatalf("the node's session changed during renewals: connected %v session %d, was %d\nnode log:\n%s", n.Connected, n.SessionID, session, node.log)
		}
		if last := expiries[len(expiries)-1]; n.CertNotAfter.After(last) {
			expiries = append(expiries, n.CertNotAfter)
			st, err := status(t, h)
			if err != nil {
				t.Fatal(err)
			}
			// The socket may lag the store by the moment between the store's
			// write and the node's.
			for i := 0; i < 50 && !st.CertNotAfter.Equal(n.CertNotAfter); i++ {
				time.Sleep(100 * time.Millisecond)
				st, _ = status(t, h)
			}
			if !st.CertNotAfter.Equal(n.CertNotAfter) || !st.Connected || st.Renewal != "" || !st.NextRenewal.After(time.Now()) {
				t.Errorf("status after renewal %d: %+v, want cert_not_after %v, connected, no renewal error", len(expiries)-1, st, n.CertNotAfter)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(h.data, agent.KeyNextFile)); err == nil {
		t.Error("node.key.next left after the renewals")
	}
	if c := strings.Count(node.log.String(), "node certificate renewed"); c != 2 {
		t.Errorf("the node logged %d renewals, want 2:\n%s", c, node.log)
	}
	// The renewed identity is what a restarted node loads, and the gateway takes it.
	node.stop()
	startAgent(t, "node", "--config", h.config)
	cp.waitNode(id, 60*time.Second, "reconnected with the renewed certificate", func(n nodeRow) bool { return n.Connected && n.SessionID != session })
}

// TestRenewalResumesAfterKill: a node killed (SIGKILL) after the control plane
// answered its renewal, with node.key.next written and the certificate not
// stored, renews on restart with the same key.
func TestRenewalResumesAfterKill(t *testing.T) {
	t.Parallel()
	fake := fakeBcd(t)
	cp := newControlPlane(t, "--cert-lifetime", certLifetime)
	h, id := joinedNode(t, cp, bcdBin)
	oldKey, _ := os.ReadFile(filepath.Join(h.data, agent.KeyFile))
	node := startAgentBin(t, fake, []string{"BCD_TEST_RENEWAL_STOP=" + agent.RenewStepAnswered}, "node", "--config", h.config)
	n := cp.waitNode(id, 60*time.Second, "ready and connected", func(n nodeRow) bool { return n.Connected })
	first := n.CertNotAfter
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(node.log.String(), "renewal stopped after step "+agent.RenewStepAnswered) {
		if time.Now().After(deadline) {
			t.Fatalf("the renewal did not reach %s within 3 minutes\nnode log:\n%s", agent.RenewStepAnswered, node.log)
		}
		time.Sleep(500 * time.Millisecond)
	}
	node.cmd.Process.Signal(syscall.SIGKILL)
	<-node.done

	// The control plane moved on; the node still holds the old pair and the next key.
	if n := cp.node(t, id); !n.CertNotAfter.After(first) {
		t.Errorf("the control plane did not store the renewal before the kill: %v", n.CertNotAfter)
	}
	next, err := os.ReadFile(filepath.Join(h.data, agent.KeyNextFile))
	if err != nil {
		t.Fatalf("node.key.next after the kill: %v", err)
	}
	if key, _ := os.ReadFile(filepath.Join(h.data, agent.KeyFile)); string(key) != string(oldKey) {
		t.Error("node.key changed before the certificate was stored")
	}
	if data, _ := os.ReadFile(filepath.Join(h.data, agent.IdentityFile)); strings.Contains(string(data), `"next"`) {
		t.Error("identity.json holds a next certificate, though the kill came before it was stored")
	}

	// The restart (a production build) finishes the renewal with that key.
	restarted := startAgent(t, "node", "--config", h.config)
	var renewed nodeRow
	deadline = time.Now().Add(90 * time.Second)
	for {
		renewed = cp.node(t, id)
		st, err := status(t, h)
		_, nextErr := os.Stat(filepath.Join(h.data, agent.KeyNextFile))
		if err == nil && renewed.Connected && st.Connected && st.CertNotAfter.Equal(renewed.CertNotAfter) && os.IsNotExist(nextErr) && renewed.CertNotAfter.After(first) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart: node %+v status %+v (%v)\nnode log:\n%s\nserve log:\n%s", renewed, st, err, restarted.log, cp.log)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if key, _ := os.ReadFile(filepath.Join(h.data, agent.KeyFile)); string(key) != string(next) {
		t.Error("node.key is not the next key the killed renewal wrote")
	}
	if !strings.Contains(restarted.log.String(), "resuming an unfinished certificate renewal") {
		t.Errorf("the restarted node did not say it resumed the renewal:\n%s", restarted.log)
	}
}

// TestRenewalOfADeletedNodeIsRefused: a deleted node's renewal is refused, and its
// status socket and log say so.
func TestRenewalOfADeletedNodeIsRefused(t *testing.T) {
	t.Parallel()
	cp := newControlPlane(t, "--cert-lifetime", certLifetime)
	h, id := joinedNode(t, cp, bcdBin)
	node := startAgent(t, "node", "--config", h.config)
	cp.waitNode(id, 60*time.Second, "ready and connected", func(n nodeRow) bool { return n.Connected })
	cp.mustBC("nodes", "delete", id, "--yes")
	deadline := time.Now().Add(3 * time.Minute)
	var st agent.SessionStatus
	for {
		var err error
		st, err = status(t, h)
		if err == nil && strings.HasPrefix(st.Renewal, "refused: "+protocol.CodeNodeRevoked+": ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status %+v (%v), want the renewal refused\nnode log:\n%s", st, err, node.log)
		}
		time.Sleep(time.Second)
	}
	if !strings.Contains(st.Renewal, "was deleted") || !strings.HasSuffix(st.Renewal, "bcd join --reset --yes, then bcd join") || st.CertNotAfter.IsZero() {
		t.Errorf("status %+v: want the reason, the way back and the certificate's expiry", st)
	}
	log := node.log.String()
	if !strings.Contains(log, "the control plane refused to renew the node certificate") || !strings.Contains(log, "ERROR") && !strings.Contains(log, `"level":"ERROR"`) {
		t.Errorf("the node did not log the refusal at ERROR:\n%s", log)
	}
}
