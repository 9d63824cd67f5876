package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/buildinfo"
)

// ServerVerbs are the verbs of kibotos-server, in the order of the help,
// with their short help: kibotos-server defines them, and kibotos lists
// them and hands them over.
var ServerVerbs = []struct{ Name, Short string }{
	{"up", "Run the embedded deployment: control plane, host agent and SQLite store under --home"},
	{"ctrl", "Run the control plane alone, on PostgreSQL (--store) or on SQLite under --home (one replica)"},
	{"host", "Run a host agent alone against a control plane (kibotos ctrl), with its state under --home"},
}

// ServerVerbShort returns the short help of the server verb name.
func ServerVerbShort(name string) string {
	for _, v := range ServerVerbs {
		if v.Name == name {
			return v.Short
		}
	}
	panic("cli: no server verb " + name)
}

// Root returns the root of the kibotos command: the given verbs, version
// and the CLI's Commands.
func Root(verbs ...*cobra.Command) *cobra.Command {
	root := &cobra.Command{
		Use:           "kibotos",
		Short:         "Isolated Linux workspaces on demand",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(verbs...)
	root.AddCommand(versionCommand())
	root.AddCommand(Commands()...)
	return root
}

// Main runs root on the process's arguments until SIGINT, SIGTERM or SIGHUP and
// exits: with the remote process's exit code after `ws exec`, else 0; 128
// plus the signal, as a shell reports a command a signal ended, when a
// signal cut a command short; or 1 after printing the error.
func Main(root *cobra.Command) {
	ctx, cancel := context.WithCancelCause(context.Background())
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, interruptSignals...)
	go func() {
		for s := range signals {
			cancel(interrupted{s.(syscall.Signal)})
		}
	}()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	err := root.ExecuteContext(ctx)
	signal.Stop(signals)
	if err == nil {
		return
	}
	var exit *ExitError
	if errors.As(err, &exit) {
		os.Exit(exit.Code)
	}
	var sig interrupted
	if errors.As(context.Cause(ctx), &sig) && (errors.Is(err, context.Canceled) || connect.CodeOf(err) == connect.CodeCanceled) {
		// What the cut-short call says is only that it was canceled.
		fmt.Fprintf(os.Stderr, "kibotos: interrupted by %s\n", unix.SignalName(sig.Signal))
		os.Exit(128 + int(sig.Signal))
	}
	fmt.Fprintln(os.Stderr, "kibotos:", printable(explainText(err, os.Args[1:]).Error(), true)) // errors quote the workspace
	os.Exit(1)
}

// explainText names the argument that is not UTF-8 text when err is the
// client's refusal to send such a request (connect calls it internal,
// naming no field): the API carries text as UTF-8.
func explainText(err error, args []string) error {
	if connect.CodeOf(err) != connect.CodeInternal || !strings.Contains(err.Error(), "invalid UTF-8") {
		return err
	}
	for _, arg := range args {
		if !utf8.ValidString(arg) {
			return fmt.Errorf("invalid_argument: the argument %q is not UTF-8 text, which is all the API carries", arg)
		}
	}
	return err
}

// interruptSignals end a command (its context), which may then clean up:
// SIGHUP too, unless the process was started with it ignored (nohup, as
// `make up` starts `kibotos up`), which it must then stay.
var interruptSignals = func() []os.Signal {
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		sigs = append(sigs, syscall.SIGHUP)
	}
	return sigs
}()

// interrupted is the cause of a command's end by a signal.
type interrupted struct{ syscall.Signal }

func (i interrupted) Error() string { return i.Signal.String() + " received" }

// versionCommand prints the version, commit and Go version of the binary.
func versionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version [-o json]",
		Short: "Print the version, commit and Go version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := buildinfo.Get()
			switch output {
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(b)
			case "", "table":
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "kibotos %s\ncommit: %s\ngo: %s\n", b.Version, b.Commit, b.GoVersion)
				return err
			}
			return fmt.Errorf("-o %q: want json or table", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: table or json")
	return cmd
}
