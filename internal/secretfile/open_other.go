//go:build !unix

package secretfile

const (
	openFlags = 0
	noFollow  = 0
)
