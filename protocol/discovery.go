package protocol

import "time"

// Refusal codes of the discovery attestor, one per reason a ramdisk's join
// with a boot nonce is refused. NONCE_UNKNOWN is retryable: the site agent's
// boot.nonce event may reach the control plane after the ramdisk's join.
const (
	CodeNonceUnknown         = "NONCE_UNKNOWN"          // no site agent reported this nonce
	CodeNonceUsed            = "NONCE_USED"             // already consumed (a replay) or presented by another key
	CodeNonceExpired         = "NONCE_EXPIRED"          // past its expires_at
	CodeNonceWrongMAC        = "NONCE_WRONG_MAC"        // minted for a MAC the join's claims do not list
	CodeMachineNotRegistered = "MACHINE_NOT_REGISTERED" // the MAC is no machine of the nonce's site
)

// MaxBootNonceLifetime bounds BootNonce.ExpiresAt: the control plane refuses
// a nonce that expires further ahead than this.
const MaxBootNonceLifetime = time.Hour
