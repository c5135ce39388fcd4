// Package cli holds what the two binaries' cobra trees share: how errors become exit
// codes, and the rule that a usage error exits 2 with a message naming the problem.
package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// ExitError carries the exit code a command wants; its message is printed as is.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// errSilent marks an exit whose command has already said everything.
var errSilent = errors.New("exit")

// ExitSilently ends the program with code and prints nothing more.
func ExitSilently(code int) error { return &ExitError{Code: code, Err: errSilent} }

// Usagef is a usage error: exit 2.
func Usagef(format string, args ...any) error {
	return &ExitError{Code: 2, Err: fmt.Errorf(format, args...)}
}

// Exit wraps err so the program exits with code.
func Exit(code int, err error) error {
	if err == nil {
		return nil
	}
	return &ExitError{Code: code, Err: err}
}

// NoArgs refuses positional arguments without echoing them, since an operator may
// paste a secret in the wrong place and arguments end up in logs and shell history.
func NoArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return Usagef("%s: takes no positional arguments", cmd.CommandPath())
	}
	return nil
}

// ExactArgs wants n positional arguments, naming them in the error.
func ExactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return Usagef("%s: wants %s (got %d arguments)", cmd.CommandPath(), names, len(args))
		}
		return nil
	}
}

// Prepare sets the behaviour every command of root shares: no usage dump on a
// runtime error, flag errors as usage errors, no completion command.
func Prepare(root *cobra.Command) {
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return Usagef("%s: %w", cmd.CommandPath(), err)
	})
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.HasSubCommands() && !c.Runnable() {
			// A group command with no run of its own: an unknown subcommand is a usage error.
			c.Args = func(cmd *cobra.Command, args []string) error {
				if len(args) > 0 {
					return Usagef("%s: unknown command %q", cmd.CommandPath(), args[0])
				}
				return nil
			}
			c.RunE = func(cmd *cobra.Command, args []string) error {
				return Usagef("%s: missing subcommand (see %s --help)", cmd.CommandPath(), cmd.CommandPath())
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// Run executes root with args and returns the process exit code: 0, the code of an
// ExitError, 2 for errors cobra raises before a command runs, 1 otherwise.
func Run(root *cobra.Command, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	Prepare(root)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	ran := false
	prev := root.PersistentPreRunE
	root.PersistentPreRunE = func(cmd *cobra.Command, a []string) error {
		ran = true
		if prev != nil {
			return prev(cmd, a)
		}
		return nil
	}
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) && ee.Err == errSilent {
		return ee.Code
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, root.Name()) {
		msg = root.Name() + ": " + msg
	}
	fmt.Fprintln(stderr, msg)
	if errors.As(err, &ee) {
		return ee.Code
	}
	if !ran {
		return 2 // cobra refused the command line before any command ran
	}
	return 1
}
