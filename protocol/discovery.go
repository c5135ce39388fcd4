package protocol

import (
	"encoding/json"
	"time"
)

// Refusal codes of the discovery attestor, one per reason a ramdisk's join
// with a boot nonce is refused. NONCE_UNKNOWN is retryable: the site agent's
// boot.nonce event may reach the control plane after the ramdisk's join.
const (
	CodeNonceUnknown         = "NONCE_UNKNOWN"          // no site agent reported this nonce
	CodeNonceUsed            = "NONCE_USED"             // already consumed (a replay) or presented by another key
	CodeNonceExpired         = "NONCE_EXPIRED"          // past its expires_at
	CodeNonceWrongMAC        = "NONCE_WRONG_MAC"        // minted for a MAC the join's claims do not list
	CodeNonceNotWitnessed    = "NONCE_NOT_WITNESSED"    // no valid witness of the site agent that minted the nonce
	CodeMachineNotRegistered = "MACHINE_NOT_REGISTERED" // the MAC is no machine of the nonce's site
	CodeMachineHasRamdisk    = "MACHINE_HAS_RAMDISK"    // retryable: the machine's ramdisk is connected; a second one is refused
)

// MaxBootNonceLifetime bounds BootNonce.ExpiresAt: the control plane refuses
// a nonce that expires further ahead than this.
const MaxBootNonceLifetime = time.Hour

// WitnessPath is the site agent's boot HTTP server's witness endpoint (POST a
// WitnessRequest, get a BootWitness); its URL is bcd.witness on the ramdisk's
// kernel command line.
const WitnessPath = "/v1/witness"

// WitnessRequest is what a ramdisk asks the site agent to vouch for: its boot
// nonce and the SHA-256 of the CSR it joins with.
type WitnessRequest struct {
	BootNonce string `json:"boot_nonce"`
	CSRSHA256 string `json:"csr_sha256"` // lowercase hex of SHA-256 over the CSR's DER
}

// BootWitness is a site agent's countersignature of a ramdisk's discovery
// join: what the site saw on its provisioning network when the ramdisk asked.
// Payload is a WitnessPayload's JSON; Signature is ASN.1 ECDSA (or the node
// key's own scheme) over SHA-256 of Payload, by the site node's key, whose
// SubjectPublicKeyInfo is PublicKey. The control plane takes it only when
// PublicKey is the current certificate key of the site node that minted the
// nonce.
type BootWitness struct {
	Payload   []byte `json:"payload"`    // a WitnessPayload, as signed
	Signature []byte `json:"signature"`  // over SHA-256(Payload)
	PublicKey []byte `json:"public_key"` // DER SubjectPublicKeyInfo of the signer
}

// WitnessPayload is the L2 evidence a BootWitness signs.
type WitnessPayload struct {
	NodeID      string    `json:"node_id"`          // the site node that signs
	NonceSHA256 string    `json:"nonce_sha256"`     // hex SHA-256 of the boot nonce
	CSRSHA256   string    `json:"csr_sha256"`       // the join's CSR, as in WitnessRequest
	MAC         string    `json:"mac"`              // the neighbour table's MAC for IP
	IP          string    `json:"ip"`               // the ramdisk's source address
	Interface   string    `json:"interface"`        // where the request came in
	Checked     bool      `json:"neighbor_checked"` // false: [boot] trust_any_neighbor (simulations)
	Time        time.Time `json:"time"`
}

// DecodeWitnessPayload reads a BootWitness's payload.
func DecodeWitnessPayload(b []byte) (WitnessPayload, error) {
	var p WitnessPayload
	err := json.Unmarshal(b, &p)
	return p, err
}

// WitnessMaxAge bounds how old a BootWitness the control plane takes is.
const WitnessMaxAge = 10 * time.Minute

// BootRefused is the data of a boot.refused event: the site agent refused a
// boot nonce or a witness to a client whose L2 evidence does not fit the MAC
// it claims (someone may be spoofing the machine), or one that asked too often.
type BootRefused struct {
	MAC         string    `json:"mac"`                    // the MAC claimed
	IP          string    `json:"ip"`                     // the client's source address
	NeighborMAC string    `json:"neighbor_mac,omitempty"` // what the neighbour table says of IP
	Interface   string    `json:"interface,omitempty"`
	Reason      string    `json:"reason"`
	Count       int       `json:"count,omitempty"` // refusals coalesced into this event
	Time        time.Time `json:"time"`
}
