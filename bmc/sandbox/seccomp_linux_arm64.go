package sandbox

import "golang.org/x/sys/unix"

const (
	archAudit = unix.AUDIT_ARCH_AARCH64
	archX32   = false
)

// allowArch: arm64 has only the *at and p* variants, all in allowCommon.
var allowArch []uint32
