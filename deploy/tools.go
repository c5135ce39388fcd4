package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// toolPackages names the Debian package of each tool deploy runs, for the error
// that says one is missing.
var toolPackages = map[string]string{
	"debugfs": "e2fsprogs",
	"e2fsck":  "e2fsprogs",
	"mdir":    "mtools",
	"mmd":     "mtools",
	"mcopy":   "mtools",
	"xz":      "xz-utils",
}

// ErrToolMissing is wrapped by the error for a tool that is not on PATH.
var ErrToolMissing = errors.New("tool not found on PATH")

func lookTool(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", &Error{Reason: reasonTool, Err: fmt.Errorf("%s (%s): %w", name, toolPackages[name], ErrToolMissing)}
	}
	return p, nil
}

// maxToolOutput bounds what is kept of a tool's output: a listing of /etc is a few
// tens of KiB; nothing deploy reads is larger than a BLS entry or a command line.
const maxToolOutput = 8 << 20

type cappedBuffer struct {
	bytes.Buffer
	dropped bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := maxToolOutput - c.Len(); len(p) > room {
		c.dropped = true
		if room > 0 {
			c.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return c.Buffer.Write(p)
}

// runTool runs a tool with a clean, C-locale environment plus env, returning its
// stdout and stderr. A non-zero exit is an error that quotes stderr (tools here
// never see secrets on argv or in their output: contents travel in 0600 files).
func runTool(ctx context.Context, name string, env []string, args ...string) (stdout, stderr []byte, err error) {
	p, err := lookTool(name)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, p, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "HOME=/"}, env...)
	var out, errb cappedBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	if out.dropped {
		return nil, nil, fmt.Errorf("%s: more than %d bytes of output", name, maxToolOutput)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("%s: %w", name, ctx.Err())
		}
		return out.Bytes(), errb.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, firstLines(errb.String(), 5))
	}
	return out.Bytes(), errb.Bytes(), nil
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "…")
	}
	return strings.Join(lines, "; ")
}
