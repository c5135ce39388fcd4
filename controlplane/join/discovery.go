package join

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/refusal"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// DiscoveryRetryAfter is how long a ramdisk waiting for an operator's
// approval waits between tries.
const DiscoveryRetryAfter = 5 * time.Second

// DiscoveryStore is what the discovery attestor reads, and the two things
// it writes: a nonce's binding to the join that waits for approval, and the
// machine's timeline.
type DiscoveryStore interface {
	GetBootNonce(ctx context.Context, h token.Hash) (store.BootNonce, error)
	DeferBootNonce(ctx context.Context, h token.Hash, csrSHA256 string, at time.Time) (bool, error)
	FindMachineByMAC(ctx context.Context, mac string) (store.Machine, error)
	GetSite(ctx context.Context, name string) (store.Site, error)
	GetNode(ctx context.Context, id string) (store.Node, error)
	AddMachineEvent(ctx context.Context, e store.MachineEvent) error
}

// NonceHash is what the store keeps of a boot nonce.
func NonceHash(nonce string) token.Hash { return sha256.Sum256([]byte(nonce)) }

// NewDiscoveryAttestor is the discovery attestor: a ramdisk joins with the
// boot nonce the site agent put on its kernel command line. The nonce must
// be one a site agent reported (looked up by its SHA-256, so the lookup
// says nothing about the nonce), unused, unexpired, minted for a MAC the
// join's claims list, and that MAC a machine of the nonce's site. The
// ramdisk then joins as a new node of role ramdisk in the machine's site,
// bound to the machine, and the nonce is consumed in the same transaction,
// so of two joins with one nonce exactly one gets a certificate.
//
// In a site with manual approval a machine that is not approved is
// deferred (RetryAfter DiscoveryRetryAfter) and the nonce is bound to the
// join's CSR: the same CSR retried after `machines approve` succeeds even
// once the nonce's lifetime has passed, and no other key can use it.
//
// A machine with an enrolled TPM endorsement key (machines enroll-tpm, or
// an approved tpm join) admits only a ramdisk that proves that EK, in the
// tpm attestor's two rounds (opts seal the challenge; see NewTPMAttestor):
// the join carries the TPM's evidence (JoinRequest.TPM, with the AK's
// certification of the node key), round one is answered with a credential
// challenge sealed to the enrolled EK, and round two, with the secret only
// that TPM recovers, is admitted with the EK as the ramdisk node's proven
// EK (Admission.ProvenEK), which deploy.image requires. A join without the
// evidence, of another EK, or whose evidence or answer does not verify is
// refused ATTESTOR_REFUSED (INVALID_INPUT for evidence that does not
// decode), with a join.refused entry on the machine's timeline. A machine
// without an enrolled EK is admitted on the witness alone, as before, and
// evidence sent for it is not looked at.
func NewDiscoveryAttestor(st DiscoveryStore, opts TPMOptions) Attestor {
	return AttestorFunc(func(ctx context.Context, r *Request) (Verdict, error) {
		req := r.Join
		switch {
		case req.Role != protocol.RoleRamdisk:
			return Verdict{}, refuse(protocol.CodeWrongRole, "the %s attestor admits role %s only, not %s", protocol.AttestorDiscovery, protocol.RoleRamdisk, human.Short(req.Role))
		case req.NodeID != "":
			return Verdict{}, refuse(protocol.CodeInvalidInput, "node_id is for the %s attestor; a ramdisk gets a new node id at every boot", protocol.AttestorProvisioned)
		case req.SealedToken != "":
			return Verdict{}, refuse(protocol.CodeInvalidInput, "the %s attestor takes a boot_nonce, not a join token", protocol.AttestorDiscovery)
		case req.BootNonce == "":
			return Verdict{}, refuse(protocol.CodeInvalidInput, "the %s attestor needs boot_nonce (%s from the kernel command line)", protocol.AttestorDiscovery, protocol.CmdlineBootNonce)
		case !protocol.ValidBootNonce(req.BootNonce):
			// Never echoed: whatever it is, it was meant to be secret.
			return Verdict{}, refuse(protocol.CodeInvalidInput, "boot_nonce is not a boot nonce (16 to 256 printable characters, no spaces or quotes)")
		}
		h := NonceHash(req.BootNonce)
		n, err := st.GetBootNonce(ctx, h)
		if errors.Is(err, store.ErrNotFound) {
			e := refusal.New(protocol.CodeNonceUnknown, "no site agent reported this boot nonce (yet): it is not one the control plane knows")
			e.Retryable = true
			return Verdict{}, e
		}
		if err != nil {
			return Verdict{}, err
		}
		m, err := st.FindMachineByMAC(ctx, n.MAC)
		switch {
		case errors.Is(err, store.ErrNotFound):
			m = store.Machine{}
		case err != nil:
			return Verdict{}, err
		case m.Site != n.Site:
			m = store.Machine{}
		}
		deferredHere := n.CSRSHA256 != "" && n.CSRSHA256 == r.CSRSHA256
		refusedWith := func(e *refusal.Refusal, extra map[string]string) (Verdict, error) {
			if m.ID != "" {
				d := map[string]string{"code": e.Code, "mac": n.MAC}
				for k, v := range extra {
					if v != "" {
						d[k] = v
					}
				}
				data, _ := json.Marshal(d)
				if err := st.AddMachineEvent(ctx, store.MachineEvent{MachineID: m.ID, Time: r.Now, Kind: protocol.MachineEventJoinRefused,
					Message: "a ramdisk join was refused: " + e.Error(), Data: data}); err != nil {
					return Verdict{}, err
				}
			}
			return Verdict{}, e
		}
		refused := func(code, format string, args ...any) (Verdict, error) {
			return refusedWith(refusal.New(code, format, args...), nil)
		}
		switch {
		case !n.UsedAt.IsZero():
			return refused(protocol.CodeNonceUsed, "the boot nonce for %s was already used by node %s at %s; a nonce admits one join (PXE-boot the machine again for a new one)",
				n.MAC, n.UsedBy, n.UsedAt.UTC().Format(time.RFC3339))
		case n.CSRSHA256 != "" && !deferredHere:
			return refused(protocol.CodeNonceUsed, "the boot nonce for %s was presented by another join (another key), which waits for approval", n.MAC)
		case !r.Now.Before(n.ExpiresAt) && !deferredHere:
			return refused(protocol.CodeNonceExpired, "the boot nonce for %s expired at %s; PXE-boot the machine again for a new one",
				n.MAC, n.ExpiresAt.UTC().Format(time.RFC3339))
		case !claimsMAC(req.Claims, n.MAC):
			return refused(protocol.CodeNonceWrongMAC, "the boot nonce was minted for another MAC than the %d in this join's claims.macs", len(req.Claims.MACs))
		case req.Site != "" && req.Site != n.Site:
			return refused(protocol.CodeWrongSite, "the boot nonce was minted by a site agent of site %s, the join says site %s", n.Site, human.Short(req.Site))
		}
		if why, err := checkWitness(ctx, st, r, n, deferredHere); err != nil {
			return Verdict{}, err
		} else if why != "" {
			return refused(protocol.CodeNonceNotWitnessed, "the join for %s is not vouched for by the site agent that minted its boot nonce: %s", n.MAC, why)
		}
		switch {
		case m.ID == "":
			return Verdict{}, refuse(protocol.CodeMachineNotRegistered, "MAC %s is not a machine of site %s (better-compute machines add --site %s --mac %s)",
				n.MAC, n.Site, n.Site, n.MAC)
		}
		// A machine with an enrolled EK: the ramdisk proves it is that TPM's.
		ek, err := checkMachineEK(r, opts, m)
		if e := refusal.As(err); e != nil {
			return refusedWith(e, map[string]string{"enrolled_ek_sha256": m.TPMEKSHA256, "ek_sha256": ek.ev.ekHash})
		} else if err != nil {
			return Verdict{}, err
		}
		// A second ramdisk for a machine whose ramdisk is connected: the
		// machine cannot run two, so one of them is not the machine. Retryable,
		// so that a machine power-cycled under its ramdisk joins once the
		// gateway has seen the old session end.
		if m.BoundRamdisk != "" && !deferredHere {
			old, err := st.GetNode(ctx, m.BoundRamdisk)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return Verdict{}, err
			}
			if err == nil && !old.Deleted() && old.SessionID != 0 {
				e := refusal.New(protocol.CodeMachineHasRamdisk, "machine %s already runs ramdisk node %s, connected now; a second ramdisk claiming it is refused (someone may be spoofing the machine). Once that session ends the join is admitted",
					m.ID, old.ID)
				e.Retryable = true
				data, _ := json.Marshal(map[string]string{"code": protocol.CodeMachineHasRamdisk, "mac": n.MAC, "ramdisk": old.ID, "csr_sha256": r.CSRSHA256})
				if err := st.AddMachineEvent(ctx, store.MachineEvent{MachineID: m.ID, Time: r.Now, Kind: protocol.MachineEventSpoofed,
					Message: "a second ramdisk claimed the machine while ramdisk " + old.ID + " is connected: refused", Data: data}); err != nil {
					return Verdict{}, err
				}
				return Verdict{}, e
			}
		}
		site, err := st.GetSite(ctx, m.Site)
		if err != nil {
			return Verdict{}, err
		}
		if site.ManualApproval() && !m.Approved {
			first, err := st.DeferBootNonce(ctx, h, r.CSRSHA256, r.Now)
			switch {
			case errors.Is(err, store.ErrNonceUsed), errors.Is(err, store.ErrNonceClaimed):
				return refused(protocol.CodeNonceUsed, "the boot nonce for %s was used by another join meanwhile", n.MAC)
			case err != nil:
				return Verdict{}, err
			}
			if first {
				if err := st.AddMachineEvent(ctx, store.MachineEvent{MachineID: m.ID, Time: r.Now, Kind: protocol.MachineEventJoinDeferred,
					Message: fmt.Sprintf("the ramdisk waits for approval (site %s approves manually): better-compute machines approve %s", m.Site, m.ID)}); err != nil {
					return Verdict{}, err
				}
			}
			return Verdict{RetryAfter: DiscoveryRetryAfter}, nil
		}
		if ek.required && !ek.proven {
			ch, err := newChallenge(r, opts.Bundle, ek.ev)
			if err != nil {
				return Verdict{}, err
			}
			return Verdict{Challenge: ch}, nil
		}
		inventory, err := json.Marshal(req.Claims)
		if err != nil {
			return Verdict{}, fmt.Errorf("discovery: claims: %w", err)
		}
		provenEK := ""
		if ek.proven {
			provenEK = ek.ev.ekHash
		}
		return Verdict{Admit: &Admission{
			Role:      protocol.RoleRamdisk,
			Site:      m.Site,
			NodeID:    ids.New(ids.PrefixNode, r.Now),
			BootNonce: &h,
			Machine:   m.ID,
			Inventory: inventory,
			Retire:    m.BoundRamdisk,
			ProvenEK:  provenEK,
		}}, nil
	})
}

// machineEK is what a discovery join showed of the machine's enrolled EK.
type machineEK struct {
	// required: the machine has an enrolled EK.
	required bool
	// ev is the join's TPM evidence, checked; proven: round two's answer to
	// the challenge for it verified too.
	ev     tpmEvidence
	proven bool
}

// checkMachineEK checks a discovery join against machine m's enrolled EK:
// nothing to check without one; else the join's TPM evidence must verify,
// be of that EK, and in round two answer its challenge. A refusal says why.
func checkMachineEK(r *Request, opts TPMOptions, m store.Machine) (machineEK, error) {
	if m.TPMEKSHA256 == "" {
		return machineEK{}, nil
	}
	ek := machineEK{required: true}
	a := r.Join.TPM
	if a == nil {
		return ek, refuse(protocol.CodeAttestorRefused,
			"machine %s has an enrolled TPM (endorsement key %s) and this ramdisk sent no TPM evidence: only a ramdisk that proves that TPM is admitted (one without a TPM, or that cannot use it, is not the machine)",
			m.ID, m.TPMEKSHA256)
	}
	ev, err := checkTPMEvidence(r, opts.NodeKey)
	if err != nil {
		return ek, err
	}
	ek.ev = ev
	if ev.ekHash != m.TPMEKSHA256 {
		return ek, refuse(protocol.CodeAttestorRefused,
			"machine %s has the TPM of endorsement key %s enrolled; this ramdisk's TPM has %s: refused (a TPM that is not the machine's; if the machine's TPM was replaced, enroll the new one's EK from a source you trust: better-compute machines enroll-tpm %s --ek-file F)",
			m.ID, m.TPMEKSHA256, ev.ekHash, m.ID)
	}
	if a.ChallengeID == "" && a.Secret == "" {
		return ek, nil
	}
	if err := checkChallenge(r, opts.Bundle, ev); err != nil {
		return ek, err
	}
	ek.proven = true
	return ek, nil
}

// checkWitness says why r's witness does not vouch for the join with nonce
// n, "" when it does: it must be signed by the current certificate key of the
// site node that minted n, for n, for this join's CSR and for n's MAC, and be
// recent (unless the join was deferred with this CSR before: the approval may
// come long after).
func checkWitness(ctx context.Context, st DiscoveryStore, r *Request, n store.BootNonce, deferredHere bool) (string, error) {
	w := r.Join.Witness
	if w == nil {
		return fmt.Sprintf("the join carries no witness (bcd ramdisk asks the site agent at %s before it joins)", protocol.CmdlineWitness), nil
	}
	p, err := protocol.DecodeWitnessPayload(w.Payload)
	if err != nil {
		return "the witness payload is not JSON", nil
	}
	if p.NodeID != n.SiteNode {
		return fmt.Sprintf("the witness is signed by node %s, the nonce was minted by site node %s", human.Short(p.NodeID), n.SiteNode), nil
	}
	node, err := st.GetNode(ctx, n.SiteNode)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return "site node " + n.SiteNode + " that minted the nonce is gone", nil
	case err != nil:
		return "", err
	case node.Deleted() || node.Role != protocol.RoleSite:
		return "site node " + n.SiteNode + " that minted the nonce is deleted or no site", nil
	}
	keySHA := sha256.Sum256(w.PublicKey)
	if node.CertKeySHA256 == "" || hex.EncodeToString(keySHA[:]) != node.CertKeySHA256 {
		return "the witness is not signed with the current certificate key of site node " + n.SiteNode, nil
	}
	pub, err := x509.ParsePKIXPublicKey(w.PublicKey)
	ec, ok := pub.(*ecdsa.PublicKey)
	if err != nil || !ok {
		return "the witness's public key is not an ECDSA key", nil
	}
	digest := sha256.Sum256(w.Payload)
	if !ecdsa.VerifyASN1(ec, digest[:], w.Signature) {
		return "the witness's signature does not verify", nil
	}
	switch {
	case p.NonceSHA256 != hex.EncodeToString(n.Hash[:]):
		return "the witness is for another boot nonce", nil
	case p.CSRSHA256 != r.CSRSHA256:
		return "the witness is for another key (csr_sha256)", nil
	case p.MAC != n.MAC:
		return fmt.Sprintf("the site saw the caller as %s, the nonce is %s's", human.Short(p.MAC), n.MAC), nil
	case !deferredHere && (r.Now.Sub(p.Time) > protocol.WitnessMaxAge || p.Time.Sub(r.Now) > time.Minute):
		return fmt.Sprintf("the witness was signed at %s, more than %s from now", p.Time.UTC().Format(time.RFC3339), protocol.WitnessMaxAge), nil
	}
	return "", nil
}

// claimsMAC reports whether the claims list mac, in whatever spelling.
func claimsMAC(c protocol.Claims, mac string) bool {
	for _, m := range c.MACs {
		if n, err := protocol.NormalizeMAC(m); err == nil && n == mac {
			return true
		}
	}
	return false
}
