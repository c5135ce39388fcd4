//go:build !unix

package secretfile

import "io/fs"

const (
	openFlags = 0
	noFollow  = 0
)

// links: no portable link count outside unix.
func links(fs.FileInfo) (uint64, bool) { return 0, false }
