//go:build unix

package pki

import "syscall"

func setUmask(m int) int { return syscall.Umask(m) }
