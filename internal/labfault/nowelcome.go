//go:build labfault_nowelcome

package labfault

// NoWelcome is true in a labfault_nowelcome build: the gateway session never dials.
const NoWelcome = true
