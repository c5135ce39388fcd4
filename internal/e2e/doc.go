// Package e2e holds the cross-process tests: the real better-compute and bcd
// binaries, built by the test, started as processes on loopback, driven the way an
// operator and a host drive them. The VM tests live in testbed/.
package e2e
