// Package cptest holds what the control plane's tests share: a PKI bundle
// made in a temporary directory, a store with a site in it, join tokens, and
// join requests built the way bcd join builds them (a P-256 CSR, the token
// sealed to the join encryption key and bound to the CSR's SHA-256).
//
// It is imported only by tests.
package cptest
