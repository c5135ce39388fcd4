//go:build fakehw

package buildmode

// FakeHW is true only in binaries built with -tags fakehw.
const FakeHW = true
