//go:build !linux

package boot

import "os"

func currentNetns() (*os.File, error) { return nil, nil }

func serveInNetns(_ *os.File, serve func() error) error { return serve() }
