//go:build !fakehw

// Package buildmode tells whether this is a fakehw development build. Only a fakehw
// build may join over http:// or without pins; every host build refuses both.
package buildmode

// FakeHW is true only in binaries built with -tags fakehw.
const FakeHW = false
