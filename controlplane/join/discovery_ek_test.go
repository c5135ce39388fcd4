package join

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// A machine with an enrolled TPM endorsement key admits only a ramdisk that
// proves that EK (the tpm attestor's two rounds, in a discovery join), against
// swtpm: the machine's own TPM, another TPM, and a ramdisk with none.

// ramdiskRequest is tn's discovery join with nonce: the ramdisk's node key
// is in the TPM, and the join carries the TPM's round-one evidence unless
// noTPM.
func (n *tpmNode) ramdiskRequest(t *testing.T, site, nonce string, noTPM bool) *protocol.JoinRequest {
	t.Helper()
	req := n.request(t)
	req.Role, req.Attestor, req.Site, req.BootNonce = protocol.RoleRamdisk, protocol.AttestorDiscovery, site, nonce
	req.Claims.MACs = []string{cptest.MAC}
	req.Witness = cptest.Witness(nonce, pki.CSRSHA256(n.csrDER), nil)
	if noTPM {
		req.TPM, req.Claims.TPMEK = nil, ""
	}
	return req
}

// enrollMachineEK registers the test machine with n's EK enrolled.
func enrollMachineEK(t *testing.T, f *fixture, n *tpmNode, mut func(*store.Machine)) store.Machine {
	t.Helper()
	m := cptest.NewMachine(t, f.st, mut)
	if _, err := f.st.UpdateMachine(ctx, m.ID, store.MachineUpdate{SetTPM: true, TPM: &store.TPMEnrollment{EKSHA256: n.ekHash()}, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return m
}

// refusalsOnTimeline counts the machine's join.refused entries of code
// whose data names the enrolled EK.
func refusalsOnTimeline(t *testing.T, f *fixture, m store.Machine, code_, enrolled string) int {
	t.Helper()
	evs, err := f.st.MachineEvents(ctx, m.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		var d map[string]string
		if e.Kind == protocol.MachineEventJoinRefused && json.Unmarshal(e.Data, &d) == nil && d["code"] == code_ && d["enrolled_ek_sha256"] == enrolled {
			n++
		}
	}
	return n
}

func TestDiscoveryEnrolledEK(t *testing.T) {
	machineTPM := startSwtpm(t)
	otherTPM := startSwtpm(t)
	cases := []struct {
		name string
		// enroll: the machine has the machine TPM's EK enrolled.
		enroll bool
		// tpm is the TPM the ramdisk runs with; noTPM sends no evidence.
		other, noTPM bool
		// wantCode "" is admitted; challenged says after a round two.
		wantCode, want string
		challenged     bool
	}{
		{name: "enrolled EK, proven", enroll: true, challenged: true},
		{name: "enrolled EK, ramdisk without a TPM", enroll: true, noTPM: true, wantCode: protocol.CodeAttestorRefused, want: "sent no TPM evidence"},
		{name: "enrolled EK, another TPM", enroll: true, other: true, wantCode: protocol.CodeAttestorRefused, want: "this ramdisk's TPM has"},
		{name: "no enrollment, no TPM", noTPM: true},
		{name: "no enrollment, a TPM", other: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := discoveryFixture(t)
			machine := newTPMNode(t, machineTPM)
			ramdisk := machine
			if tc.other {
				ramdisk = newTPMNode(t, otherTPM)
			}
			var m store.Machine
			if tc.enroll {
				m = enrollMachineEK(t, f, machine, nil)
			} else {
				m = cptest.NewMachine(t, f.st, nil)
			}
			nonce := cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, 10*time.Minute)
			req := ramdisk.ramdiskRequest(t, cptest.Site, nonce, tc.noTPM)
			resp, err := f.svc.Join(ctx, req)
			if tc.wantCode != "" {
				refused(t, "round one", err, tc.wantCode, tc.want)
				if got := refusalsOnTimeline(t, f, m, tc.wantCode, machine.ekHash()); got != 1 {
					t.Errorf("%d join.refused entries naming the enrolled EK on the timeline, want 1", got)
				}
				if nodes, _ := f.st.ListNodes(ctx); len(nodes) != 1 { // the site node
					t.Errorf("a refused join wrote a node: %d nodes", len(nodes))
				}
				return
			}
			if err != nil {
				t.Fatalf("round one: %v", err)
			}
			if tc.challenged {
				if resp.TPMChallenge == nil || resp.Signed != "" {
					t.Fatalf("round one answered (signed %t, retry %d s), want a TPM challenge", resp.Signed != "", resp.RetryAfterS)
				}
				resp, err = f.svc.Join(ctx, ramdisk.answer(t, req, resp.TPMChallenge))
				if err != nil {
					t.Fatalf("round two: %v", err)
				}
			} else if resp.TPMChallenge != nil {
				t.Fatalf("a machine without an enrolled EK was challenged: %+v", resp)
			}
			res := ramdisk.verify(t, f.b, resp)
			if res.Role != protocol.RoleRamdisk {
				t.Errorf("result %+v", res)
			}
			node, err := f.st.GetNode(ctx, res.NodeID)
			if err != nil {
				t.Fatal(err)
			}
			wantEK := ""
			if tc.challenged {
				wantEK = machine.ekHash()
			}
			if node.ProvenEKSHA256 != wantEK || node.TPMEKSHA256 != "" {
				t.Errorf("ramdisk node's proven EK %q (reclaim EK %q), want %q (and none)", node.ProvenEKSHA256, node.TPMEKSHA256, wantEK)
			}
			if got, _ := f.st.GetMachine(ctx, m.ID); got.BoundRamdisk != res.NodeID {
				t.Errorf("machine's ramdisk %q, want %s", got.BoundRamdisk, res.NodeID)
			}
			evs, _ := f.st.MachineEvents(ctx, m.ID, 0)
			said := false
			for _, e := range evs {
				if e.Kind == protocol.MachineEventJoin && e.NodeID == res.NodeID {
					said = strings.Contains(e.Message, "proving TPM endorsement key "+machine.ekHash())
				}
			}
			if said != tc.challenged {
				t.Errorf("the join entry names the proven EK: %t, want %t", said, tc.challenged)
			}
		})
	}
}

// TestDiscoveryEnrolledEKRoundTwo: round two must answer the challenge with
// the machine's TPM: a forged secret, or a challenge for another CSR, is
// refused and goes on the timeline; the nonce stays unused.
func TestDiscoveryEnrolledEKRoundTwo(t *testing.T) {
	f := discoveryFixture(t)
	tp := startSwtpm(t)
	n := newTPMNode(t, tp)
	m := enrollMachineEK(t, f, n, nil)
	nonce := cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, 10*time.Minute)
	req := n.ramdiskRequest(t, cptest.Site, nonce, false)
	ch := n.challenge(t, f.svc, req)

	forged := n.answer(t, req, ch)
	a := *forged.TPM
	a.Secret = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
	forged.TPM = &a
	_, err := f.svc.Join(ctx, forged)
	refused(t, "forged secret", err, protocol.CodeAttestorRefused, "did not activate the credential")

	// Another key of the same TPM (its own CSR and witness) presents the
	// first key's challenge.
	other := newTPMNode(t, tp)
	req2 := other.ramdiskRequest(t, cptest.Site, nonce, false)
	good := n.answer(t, req, ch)
	stolen := *req2
	sa := *req2.TPM
	sa.ChallengeID, sa.Secret = good.TPM.ChallengeID, good.TPM.Secret
	stolen.TPM = &sa
	_, err = f.svc.Join(ctx, &stolen)
	refused(t, "another CSR's challenge", err, protocol.CodeAttestorRefused, "another")

	if got := refusalsOnTimeline(t, f, m, protocol.CodeAttestorRefused, n.ekHash()); got != 2 {
		t.Errorf("%d refusals on the timeline, want 2", got)
	}
	if bn, _ := f.st.GetBootNonce(ctx, NonceHash(nonce)); !bn.UsedAt.IsZero() {
		t.Error("a refused round two used the nonce")
	}
	resp, err := f.svc.Join(ctx, good)
	if err != nil {
		t.Fatalf("the right answer after the refusals: %v", err)
	}
	n.verify(t, f.b, resp)
}

// TestDiscoveryEnrolledEKManualApproval: in a site with manual approval the
// ramdisk of a machine with an enrolled EK waits for approval with its
// evidence checked, then proves the EK.
func TestDiscoveryEnrolledEKManualApproval(t *testing.T) {
	f := discoveryFixture(t)
	n := newTPMNode(t, startSwtpm(t))
	if err := f.st.CreateSite(ctx, store.Site{Name: "man1", Approval: store.ApprovalManual, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	m := enrollMachineEK(t, f, n, func(m *store.Machine) { m.Site = "man1" })
	nonce := cptest.NewNonce(t, f.st, "man1", cptest.MAC, 10*time.Minute)
	req := n.ramdiskRequest(t, "man1", nonce, false)
	resp, err := f.svc.Join(ctx, req)
	if err != nil || resp.RetryAfterS == 0 || resp.TPMChallenge != nil {
		t.Fatalf("before approval: %+v, %v; want a deferral", resp, err)
	}
	if _, err := f.st.UpdateMachine(ctx, m.ID, store.MachineUpdate{Approve: true, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	ch := n.challenge(t, f.svc, req)
	resp, err = f.svc.Join(ctx, n.answer(t, req, ch))
	if err != nil {
		t.Fatal(err)
	}
	res := n.verify(t, f.b, resp)
	if node, _ := f.st.GetNode(ctx, res.NodeID); node.ProvenEKSHA256 != n.ekHash() {
		t.Errorf("proven EK %q", node.ProvenEKSHA256)
	}
	if !strings.HasPrefix(res.NodeID, "n_") {
		t.Errorf("node id %s", res.NodeID)
	}
}
