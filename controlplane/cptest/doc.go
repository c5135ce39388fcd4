// Package cptest holds what the control plane's tests share: a PKI bundle
// made in a temporary directory, a store with a site in it, join tokens,
// machines and boot nonces, join requests built the way bcd join and bcd
// ramdisk build them (a P-256 CSR, the token sealed to the join encryption
// key and bound to the CSR's SHA-256; or a boot nonce and MACs), and an
// agent's gateway session (Session) a test drives frame by frame.
//
// It is imported only by tests.
package cptest
