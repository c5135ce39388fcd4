// Package version holds the build's version, set at link time with
// -ldflags "-X github.com/better-compute/bcd/internal/version.Version=v0.1.0".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release this binary was built as; "dev" for a plain go build.
var Version = "dev"

// String describes the build for `version` subcommands and Hello messages.
func String(program string) string {
	commit := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				commit = " " + s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("%s %s%s %s/%s %s", program, Version, commit, runtime.GOOS, runtime.GOARCH, runtime.Version())
}
