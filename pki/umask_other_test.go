//go:build !unix

package pki

func setUmask(int) int { return 0 }
