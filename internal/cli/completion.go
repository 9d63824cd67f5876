package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// Shell completion: cobra's `kibotos completion bash|zsh|fish|powershell`
// prints the script, which calls `kibotos __complete ARGS...` whenever the
// user presses tab. The positional arguments that name a Workspace, Volume,
// Template or Transfer complete to the IDs the server lists for the
// connection flags (and context) on the command line. A completion that
// cannot reach the server, or is refused, offers nothing and prints nothing.

// completionTimeout bounds the call behind one completion: a tab that
// hangs is worse than one that offers nothing.
const completionTimeout = 2 * time.Second

// completionPageSize is how many IDs a completion reads, one page.
const completionPageSize = 500

// idCompleter lists the IDs of one kind of resource that begin with a
// prefix.
type idCompleter func(cmd *cobra.Command, prefix string) []string

// completeIDs returns the idCompleter of kind k, whose resources have the
// ID id returns.
func completeIDs[C any, S, R proto.Message](k kind[C, S, R], id func(R) string) idCompleter {
	return func(cmd *cobra.Command, prefix string) []string {
		c := connOf(cmd)
		cl, err := dial(cmd, c, k.newClient)
		if err != nil {
			return nil
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		items, _, err := k.list(ctx, cl, listQuery{pageSize: completionPageSize})
		if err != nil {
			return nil
		}
		var ids []string
		for _, r := range items {
			if s := id(r); strings.HasPrefix(s, prefix) {
				ids = append(ids, s)
			}
		}
		return ids
	}
}

// connOf returns the connection flags cmd was given: they are persistent
// flags of its group, read here by name because a completion runs
// outside the command.
func connOf(cmd *cobra.Command) *conn {
	c := &conn{output: outputTable}
	for name, v := range map[string]*string{"addr": &c.addr, "token": &c.token, "home": &c.home, "ca-file": &c.caFile, "context": &c.context} {
		if f := cmd.Flags().Lookup(name); f != nil {
			*v = f.Value.String()
		}
	}
	return c
}

var (
	workspaceIDs = completeIDs(workspaces, (*ctrlv1.Workspace).GetWorkspaceId)
	volumeIDs    = completeIDs(volumes, (*ctrlv1.Volume).GetVolumeId)
	templateIDs  = completeIDs(templates, (*ctrlv1.Template).GetTemplateId)
	transferIDs  = completeIDs(transfers, (*ctrlv1.Transfer).GetTransferId)
)

// placeholders maps, for each top-level group, the names its usage lines
// give positional arguments to the resources they name.
var placeholders = map[string]map[string]idCompleter{
	"ws":       {"ID": workspaceIDs, "WS": workspaceIDs},
	"volume":   {"ID": volumeIDs},
	"template": {"ID": templateIDs},
	"transfer": {"ID": transferIDs, "TRANSFER_ID": transferIDs},
}

// addCompletion gives every command under group whose usage line names a
// resource ID among its positional arguments a completion of those IDs.
// Verbs that create a resource complete nothing: their ID is new.
func addCompletion(group *cobra.Command) {
	names, ok := placeholders[group.Name()]
	if !ok {
		return
	}
	var walk func(cmd *cobra.Command)
	walk = func(cmd *cobra.Command) {
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
		if cmd.ValidArgsFunction != nil || cmd.Name() == "create" || !cmd.Runnable() {
			return
		}
		var complete []idCompleter
		for _, p := range positionals(cmd.Use) {
			complete = append(complete, names[p])
		}
		cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
			if len(args) >= len(complete) || complete[len(args)] == nil {
				return nil, cobra.ShellCompDirectiveDefault
			}
			return complete[len(args)](cmd, prefix), cobra.ShellCompDirectiveNoFileComp
		}
	}
	walk(group)
}

// positionals returns the positional arguments of a usage line such as
// "exec [-i] [--user NAME] ID -- COMMAND [ARG...]": the words after the
// command's name outside brackets and parentheses that are not flags
// (ID, COMMAND).
func positionals(use string) []string {
	var out []string
	depth := 0
	for _, w := range strings.Fields(use)[1:] {
		if depth == 0 && !strings.HasPrefix(w, "-") && !strings.ContainsAny(w[:1], "[(") {
			out = append(out, w)
		}
		depth += strings.Count(w, "[") + strings.Count(w, "(") - strings.Count(w, "]") - strings.Count(w, ")")
	}
	return out
}
