package cli

import (
	"context"
	"fmt"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// kind adapts the generated client of one ctrl resource to the verbs egress
// and resolver share, so that both take the same arguments and flags and
// print the same way. C is the client, S the spec and R the resource
// message. Every func returns the response message (printed by -o json) and
// the resource it carries (printed as a table).
type kind[C any, S, R proto.Message] struct {
	name   string // "egress", as in help and messages
	plural string // "egresses"
	// specUse shows the spec flags in the usage line of create and update.
	specUse   string
	newClient func(connect.HTTPClient, string, ...connect.ClientOption) C
	// newSpecFlags returns the flags create and update build the spec from.
	newSpecFlags func() specFlags[S]
	table        table[R]
	revision     func(R) uint64

	create func(ctx context.Context, cl C, cmd *ctrlv1.CommandMetadata, spec S, labels, annotations map[string]string) (proto.Message, R, error)
	get    func(ctx context.Context, cl C, id string) (proto.Message, R, error)
	list   func(ctx context.Context, cl C, q listQuery) (items []R, next string, err error)
	// listResponse builds the message -o json prints for a list, possibly
	// accumulated over several pages.
	listResponse func(items []R, next string) proto.Message
	update       func(ctx context.Context, cl C, cmd *ctrlv1.CommandMetadata, id string, expected uint64, spec S, drain *uint32) (proto.Message, R, error)
	del          func(ctx context.Context, cl C, cmd *ctrlv1.CommandMetadata, id string) (proto.Message, error)

	labels, annotations mapField[C, R]
}

// specFlags are the flags that describe a spec; create and update take the
// same ones because an update replaces the whole spec.
type specFlags[S any] interface {
	register(cmd *cobra.Command)
	spec(cmd *cobra.Command) (S, error)
}

type listQuery struct {
	pageSize  uint32
	pageToken string
	selector  map[string]string
}

// mapField is labels or annotations: a map beside the spec that is replaced
// as a whole under its own CAS revision.
type mapField[C any, R proto.Message] struct {
	verb     string // "label"
	noun     string // "labels"
	revision func(R) uint64
	set      setMap[C, R]
}

// setMap replaces the labels or annotations of one resource under the
// expected revision of that map.
type setMap[C any, R proto.Message] func(ctx context.Context, cl C, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, R, error)

// labelField is the mapField of the labels of a kind.
func labelField[C any, R proto.Message](revision func(R) uint64, set setMap[C, R]) mapField[C, R] {
	return mapField[C, R]{verb: "label", noun: "labels", revision: revision, set: set}
}

// annotationField is the mapField of the annotations of a kind.
func annotationField[C any, R proto.Message](revision func(R) uint64, set setMap[C, R]) mapField[C, R] {
	return mapField[C, R]{verb: "annotate", noun: "annotations", revision: revision, set: set}
}

// command returns the top-level command of the kind with all its verbs.
func (k kind[C, S, R]) command(short string) *cobra.Command {
	cmd := &cobra.Command{Use: k.name, Short: short}
	c := addConnFlags(cmd)
	cmd.AddCommand(
		k.createCommand(c),
		k.getCommand(c),
		k.listCommand(c),
		k.updateCommand(c),
		k.deleteCommand(c),
		k.mapCommand(c, k.labels),
		k.mapCommand(c, k.annotations),
	)
	return cmd
}

func (k kind[C, S, R]) createCommand(c *conn) *cobra.Command {
	var (
		meta metaFlags
		spec = k.newSpecFlags()
	)
	cmd := &cobra.Command{
		Use:   "create " + k.specUse + " [--label k=v ...] [--annotation k=v ...]",
		Short: "Create " + article(k.name) + " " + k.name,
		Args:  cobra.NoArgs,
	}
	spec.register(cmd)
	meta.register(cmd)
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		s, err := spec.spec(cmd)
		if err != nil {
			return err
		}
		labels, annotations, err := meta.parse()
		if err != nil {
			return err
		}
		cl, err := dial(cmd, c, k.newClient)
		if err != nil {
			return err
		}
		resp, r, err := k.create(cmd.Context(), cl, c.command(cmd, *commandID), s, labels, annotations)
		if err != nil {
			return err
		}
		return show(cmd, c, resp, k.table, r)
	}
	return cmd
}

func (k kind[C, S, R]) getCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show one " + k.name,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := dial(cmd, c, k.newClient)
			if err != nil {
				return err
			}
			resp, r, err := k.get(cmd.Context(), cl, args[0])
			if err != nil {
				return err
			}
			return show(cmd, c, resp, k.table, r)
		},
	}
}

func (k kind[C, S, R]) listCommand(c *conn) *cobra.Command {
	var (
		selector  []string
		pageSize  uint32
		pageToken string
		all       bool
	)
	cmd := &cobra.Command{
		Use:   "list [--selector k=v ...] [--page-size N] [--all]",
		Short: "List " + k.plural,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			sel, err := parsePairs("--selector", selector)
			if err != nil {
				return err
			}
			q := listQuery{pageSize: pageSize, pageToken: pageToken, selector: sel}
			cl, err := dial(cmd, c, k.newClient)
			if err != nil {
				return err
			}
			var items []R
			for {
				page, next, err := k.list(cmd.Context(), cl, q)
				if err != nil {
					return err
				}
				items = append(items, page...)
				if next != "" && next == q.pageToken {
					return fmt.Errorf("the server returned page token %q again", next)
				}
				q.pageToken = next
				if next == "" || !all {
					break
				}
			}
			if q.pageToken != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "next_page_token: %s (continue with --page-token, or list with --all)\n", q.pageToken)
			}
			return show(cmd, c, k.listResponse(items, q.pageToken), k.table, items...)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&selector, "selector", nil, "only "+k.plural+" with this label key=value (repeatable; all must match)")
	f.Uint32Var(&pageSize, "page-size", 0, "results per page (0: the server's default)")
	f.StringVar(&pageToken, "page-token", "", "continue from the next_page_token of an earlier list")
	f.BoolVar(&all, "all", false, "follow next_page_token until the last page")
	return cmd
}

func (k kind[C, S, R]) updateCommand(c *conn) *cobra.Command {
	var (
		spec     = k.newSpecFlags()
		expected uint64
		drain    uint32
	)
	cmd := &cobra.Command{
		Use:   "update ID " + k.specUse + " [--expected-revision N] [--drain-seconds N]",
		Short: "Replace the spec of " + article(k.name) + " " + k.name,
		Long: "Replace the whole spec of " + article(k.name) + " " + k.name + ": flags left out are cleared, not kept.\n\n" +
			"Without --expected-revision the command first reads the current revision (Get) and\n" +
			"updates that, so it overwrites any change made in between. When retrying with\n" +
			"--command-id, also pass --expected-revision: after a first attempt that went through,\n" +
			"the revision read anew would differ and the retry would conflict.",
		Args: cobra.ExactArgs(1),
	}
	spec.register(cmd)
	commandID := commandFlag(cmd)
	cmd.Flags().Uint64Var(&expected, "expected-revision", 0, "revision the update applies to (default: the current one, read first)")
	cmd.Flags().Uint32Var(&drain, "drain-seconds", 0, "seconds connections on the previous revision keep running, 0 to 3600 (default: the server's, 600)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		s, err := spec.spec(cmd)
		if err != nil {
			return err
		}
		var drainSeconds *uint32
		if cmd.Flags().Changed("drain-seconds") {
			drainSeconds = &drain
		}
		cl, err := dial(cmd, c, k.newClient)
		if err != nil {
			return err
		}
		id := args[0]
		rev, err := k.casRevision(cmd, cl, id, "expected-revision", expected, k.revision)
		if err != nil {
			return err
		}
		resp, r, err := k.update(cmd.Context(), cl, c.command(cmd, *commandID), id, rev, s, drainSeconds)
		if err != nil {
			return err
		}
		return show(cmd, c, resp, k.table, r)
	}
	return cmd
}

func (k kind[C, S, R]) deleteCommand(c *conn) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete " + article(k.name) + " " + k.name + " that no workspace's policy references",
		Args:  cobra.ExactArgs(1),
	}
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := dial(cmd, c, k.newClient)
		if err != nil {
			return err
		}
		resp, err := k.del(cmd.Context(), cl, c.command(cmd, *commandID), args[0])
		if err != nil {
			return err
		}
		return confirm(cmd, c, resp, "deleted %s %s", k.name, args[0])
	}
	return cmd
}

// mapCommand builds `label` or `annotate`.
func (k kind[C, S, R]) mapCommand(c *conn, f mapField[C, R]) *cobra.Command {
	var (
		expected uint64
		clearAll bool
	)
	flag := "expected-" + f.noun + "-revision"
	cmd := &cobra.Command{
		Use:   f.verb + " ID (k=v ... | --clear) [--" + flag + " N]",
		Short: "Replace the " + f.noun + " of " + article(k.name) + " " + k.name,
		Long: "Replace the " + f.noun + " of " + article(k.name) + " " + k.name + " with exactly the given set; --clear removes them all.\n\n" +
			"Without --" + flag + " the command first reads the current " + f.noun + "_revision (Get)\n" +
			"and replaces that, so it overwrites any change made in between. When retrying with\n" +
			"--command-id, also pass --" + flag + ".",
		Args: cobra.MinimumNArgs(1),
	}
	commandID := commandFlag(cmd)
	cmd.Flags().Uint64Var(&expected, flag, 0, f.noun+"_revision the change applies to (default: the current one, read first)")
	cmd.Flags().BoolVar(&clearAll, "clear", false, "remove all "+f.noun)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		id, kv := args[0], args[1:]
		switch {
		case clearAll && len(kv) > 0:
			return fmt.Errorf("--clear takes no key=value pairs")
		case !clearAll && len(kv) == 0:
			return fmt.Errorf("give the %s as key=value arguments, or --clear to remove them all", f.noun)
		}
		m, err := parsePairs("argument", kv)
		if err != nil {
			return err
		}
		cl, err := dial(cmd, c, k.newClient)
		if err != nil {
			return err
		}
		rev, err := k.casRevision(cmd, cl, id, flag, expected, f.revision)
		if err != nil {
			return err
		}
		resp, r, err := f.set(cmd.Context(), cl, c.command(cmd, *commandID), id, rev, m)
		if err != nil {
			return err
		}
		return show(cmd, c, resp, k.table, r)
	}
	return cmd
}

// casRevision returns the value of the CAS flag when the user gave it, else
// the current revision, which it reads with Get.
func (k kind[C, S, R]) casRevision(cmd *cobra.Command, cl C, id, flag string, given uint64, revision func(R) uint64) (uint64, error) {
	if cmd.Flags().Changed(flag) {
		return given, nil
	}
	_, r, err := k.get(cmd.Context(), cl, id)
	if err != nil {
		return 0, err
	}
	return revision(r), nil
}

// article returns "a" or "an" for a noun in help text.
func article(noun string) string {
	if noun != "" && (noun[0] == 'a' || noun[0] == 'e' || noun[0] == 'i' || noun[0] == 'o' || noun[0] == 'u') {
		return "an"
	}
	return "a"
}
