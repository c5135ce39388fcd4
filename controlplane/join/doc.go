// Package join is the JoinService: it turns a protocol.JoinRequest into a
// node identity, a certificate from the node CA, and a JoinResponse signed
// with the join signing key.
//
// # The flow
//
//  1. The request is checked: protocol version, role, a P-256 CSR whose
//     signature verifies (INVALID_INPUT otherwise).
//  2. The sealed token, when there is one, is opened with the join
//     encryption key and must be bound to the SHA-256 of this CSR, so a
//     captured request cannot be replayed with another key.
//  3. The attestor named by the request decides (ATTESTOR_REFUSED for one
//     this control plane does not run): admit the agent as a role in a site
//     and pool, possibly as a given node id, or defer it. A deferral answers
//     JoinResponse{RetryAfterS}; the agent retries with the same CSR and is
//     admitted once the attestor says so (an operator's approval, a boot
//     nonce that arrived). Attestors are the Attestor interface, so the
//     discovery and tpm attestors plug in without changing this flow. An
//     attestor may also answer a challenge (the tpm attestor's first round).
//  4. The pool's policy must allow the attestor (ATTESTOR_NOT_ALLOWED).
//  5. The node is chosen: the id the attestor bound (a token bound to the
//     node: the operator's decision), else an existing node whose TPM EK or
//     system UUID matches the claims (a reclaim), else a new id n_<ULID>.
//     Claims are no proof, so a reclaim needs one (RECLAIM_NOT_ALLOWED,
//     naming the node and the ways, otherwise): the tpm attestor proved the
//     node's EK, or a token with allow_reclaim and the request's
//     reclaim_proof, signed by the key of the node's current certificate
//     for this CSR and recent (protocol.ReclaimProof; bcd join signs it with
//     the node.key --reset moved aside). A node whose EK the tpm attestor
//     proved (tpm_ek_proven) is reclaimed only by the same TPM or a token
//     bound to it. WRONG_POOL, WRONG_ROLE or WRONG_SITE when the token is for
//     another pool, role or site than the node.
//  6. The certificate is issued (spiffe://<trust-domain>/<role>/<node-id>,
//     90 days) and the node written in the same store transaction that
//     consumes the token.
//
// # When a token is consumed
//
// Only on success. Every check, the attestor's included, runs before the
// token is touched, and the transaction that writes the node is the one that
// marks the token used (UPDATE … WHERE used_at IS NULL): a refused or
// deferred join leaves the token as it was, and of concurrent joins with one
// token exactly one succeeds while the others get TOKEN_USED.
//
// # The discovery attestor
//
// A ramdisk joins with the boot nonce its site agent minted and reported
// (boot.nonce, kept as its SHA-256): see NewDiscoveryAttestor. It refuses
// with NONCE_UNKNOWN (retryable: the event may still be on its way),
// NONCE_USED (consumed, or presented first by another key), NONCE_EXPIRED,
// NONCE_WRONG_MAC (minted for a MAC the claims do not list), WRONG_SITE and
// MACHINE_NOT_REGISTERED (the MAC is no machine of the nonce's site). It
// admits a new node of role ramdisk in the machine's site at every boot,
// binds it to the machine (its claims become the inventory), retires the
// machine's previous ramdisk node and consumes the nonce, all in the
// transaction that writes the node; or, in a site with manual approval and
// a machine not yet approved, defers the join for 5 s and holds the nonce
// for that CSR. Ramdisk nodes keep no system UUID or TPM EK, so they never
// take part in reclaims.
//
// A machine with an enrolled TPM EK admits only a ramdisk that proves it: the
// join carries the tpm attestor's evidence and runs its two rounds (a
// credential challenge sealed to the enrolled EK), and the EK is kept as the
// ramdisk node's proven EK, which the lifecycle requires before it sends
// deploy.image. No evidence, another EK or a wrong answer: ATTESTOR_REFUSED,
// on the machine's timeline.
//
// # The tpm attestor
//
// A node proves its TPM in two rounds (protocol.TPMAttestation): round one
// carries the EK, an attestation key and the AK's TPM2_Certify of the node
// key with the CSR's SHA-256 as qualifying data, and is answered with a
// TPMChallenge (Verdict.Challenge, JoinResponse.TPMChallenge): a secret
// sealed to the EK for the AK's Name, its ID sealed to the join encryption
// key so that nothing is stored in between. Round two brings the secret
// back. The EK's policy runs in both: an enrolled EK joins its enrollment's
// site and pool; an EK of a registered machine (by MAC, in the join's site)
// waits for `machines approve` (a deferral, one join.deferred entry on its
// timeline) and is then enrolled for it with the node; any other is
// refused. A tpm join reclaims the node of the same EK (bcd join --reset
// keeps its node id), never a node of another TPM. See NewTPMAttestor.
//
// # Pool policies
//
// After the attestor admits and before anything is written, a pool whose
// policy (joinAttestors) does not list the join's attestor refuses it with
// ATTESTOR_NOT_ALLOWED, naming the pool and the attestors it allows.
//
// A provisioned token that a machine's deploy minted binds the installed
// OS's node to the machine, and retires its ramdisk node and the node an
// earlier deployment installed. Service.Bound tells the lifecycle
// controller about every node bound to a machine.
//
// Refusals are *refusal.Refusal errors with the code that says why;
// anything else (the store failing) is for the caller to answer as a
// retryable UNAVAILABLE.
package join
