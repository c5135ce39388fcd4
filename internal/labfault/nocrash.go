//go:build !labfault_crash

package labfault

// Crash is true in a labfault_crash build: bcd node and bcd site exit 1 at once.
const Crash = false
