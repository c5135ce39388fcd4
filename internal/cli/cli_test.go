package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func testRoot() *cobra.Command {
	root := &cobra.Command{Use: "prog", Args: NoArgs}
	group := &cobra.Command{Use: "group"}
	group.AddCommand(&cobra.Command{Use: "ok", Args: NoArgs, RunE: func(*cobra.Command, []string) error { return nil }})
	group.AddCommand(&cobra.Command{Use: "fail", Args: NoArgs, RunE: func(*cobra.Command, []string) error { return errors.New("it broke") }})
	group.AddCommand(&cobra.Command{Use: "three", Args: NoArgs, RunE: func(*cobra.Command, []string) error { return Exit(3, errors.New("three")) }})
	group.AddCommand(&cobra.Command{Use: "quiet", Args: NoArgs, RunE: func(*cobra.Command, []string) error { return ExitSilently(1) }})
	group.AddCommand(&cobra.Command{Use: "one ARG", Args: ExactArgs(1, "an ARG"), RunE: func(*cobra.Command, []string) error { return nil }})
	root.AddCommand(group)
	return root
}

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string // substring of stderr; "" means stderr must be empty
	}{
		{[]string{"group", "ok"}, 0, ""},
		{[]string{"group", "fail"}, 1, "prog: it broke"},
		{[]string{"group", "three"}, 3, "three"},
		{[]string{"group", "quiet"}, 1, ""},
		{[]string{"nope"}, 2, `unknown command "nope"`},
		{[]string{}, 2, "missing subcommand"},
		{[]string{"group"}, 2, "prog group: missing subcommand"},
		{[]string{"group", "nope"}, 2, `prog group: unknown command "nope"`},
		{[]string{"group", "ok", "--bad"}, 2, "unknown flag: --bad"},
		{[]string{"group", "ok", "secret-value"}, 2, "prog group ok: takes no positional arguments"},
		{[]string{"group", "one"}, 2, "wants an ARG"},
		{[]string{"group", "one", "a"}, 0, ""},
	} {
		var stdout, stderr bytes.Buffer
		code := Run(testRoot(), tc.args, strings.NewReader(""), &stdout, &stderr)
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d (stderr %q)", tc.args, code, tc.code, stderr.String())
		}
		if tc.msg == "" && stderr.Len() != 0 {
			t.Errorf("%q: stderr %q, want nothing", tc.args, stderr.String())
		}
		if tc.msg != "" && !strings.Contains(stderr.String(), tc.msg) {
			t.Errorf("%q: stderr %q, want it to contain %q", tc.args, stderr.String(), tc.msg)
		}
		if strings.Contains(stdout.String()+stderr.String(), "secret-value") {
			t.Errorf("%q: an argument was echoed", tc.args)
		}
	}
}
