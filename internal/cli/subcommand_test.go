package cli

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestUnknownSubcommandFails runs every command group with an argument that
// names none of its subcommands: each must fail and name the word, and the
// group alone must still print its help and succeed.
func TestUnknownSubcommandFails(t *testing.T) {
	var groups []string
	var walk func(cmd *cobra.Command, path []string)
	walk = func(cmd *cobra.Command, path []string) {
		path = append(path, cmd.Name())
		if cmd.HasSubCommands() {
			groups = append(groups, strings.Join(path, " "))
		}
		for _, sub := range cmd.Commands() {
			walk(sub, path)
		}
	}
	for _, cmd := range Commands() {
		walk(cmd, nil)
	}
	if len(groups) < 8 {
		t.Fatalf("found only the groups %v", groups)
	}
	for _, group := range groups {
		args := strings.Fields(group)
		out, err := execute(append(args, "frobnicate")...)
		if err == nil || !strings.Contains(err.Error(), `unknown command "frobnicate"`) {
			t.Errorf("kibotos %s frobnicate: %v, want an unknown command error (printed %q)", group, err, out)
		}
	}
	if out, err := execute("ws"); err != nil || !strings.Contains(out, "Available Commands") {
		t.Errorf("kibotos ws: %v, printed %q; want its help", err, out)
	}
}

// execute runs `kibotos args...` as cmd/kibotos does, with nothing on
// stdin, and returns what it printed on stdout.
func execute(args ...string) (string, error) {
	root := &cobra.Command{Use: "kibotos", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(Commands()...)
	var out strings.Builder
	root.SetIn(strings.NewReader(""))
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}
