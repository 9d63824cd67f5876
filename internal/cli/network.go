package cli

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// networkHelp is what every `ws network` verb says about enforcement.
const networkHelp = "A change returns once it is stored; the Workspace's host then applies it (a stopped\n" +
	"Workspace at its next start). APPLIED_REVISION is the revision the host confirmed as\n" +
	"enforced: only when it equals REVISION is the change in force."

func wsNetworkCommand(c *conn) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "network",
		Short: "Show, change and follow the network policy of a Workspace",
		Long: "Show, change and follow the network policy of a Workspace. DENY_ALL (the default) lets\n" +
			"nothing out; PUBLIC_INTERNET lets the guest reach public addresses, narrowed by the allow\n" +
			"and deny lists, with part of the traffic sent through an Egress and DNS through a\n" +
			"Resolver when the policy names them.\n\n" + networkHelp,
	}
	cmd.AddCommand(
		wsNetworkGetCommand(c),
		wsNetworkSetCommand(c),
		wsNetworkListCommand(c, "allow", func(p *ctrlv1.NetworkPolicy) *[]string { return &p.Allow }),
		wsNetworkListCommand(c, "deny", func(p *ctrlv1.NetworkPolicy) *[]string { return &p.Deny }),
		wsNetworkWatchCommand(c),
	)
	return cmd
}

func wsNetworkGetCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show the network policy of a Workspace, what its host applied, and the faults it observes",
		Long: "Show the network policy of a Workspace, what its host confirmed as applied, and the\n" +
			"faults of the Egresses and Resolvers it uses. -o json prints the whole GetWorkspaceResponse.\n\n" + networkHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := dialCall(cmd, c, ctrlv1connect.NewWorkspaceServiceClient, ctrlv1connect.WorkspaceServiceClient.GetWorkspace, &ctrlv1.GetWorkspaceRequest{WorkspaceId: args[0]})
			if err != nil {
				return err
			}
			return showNetwork(cmd, c, resp, resp.GetWorkspace())
		},
	}
}

// policyFlags describe a whole NetworkPolicy.
type policyFlags struct {
	mode                             string
	allow, deny, egresses, resolvers []string
}

func (f *policyFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.mode, "mode", "", "deny-all or public-internet (required)")
	fl.StringArrayVar(&f.allow, "allow", nil, "address or CIDR admitted even when --deny covers it (repeatable, canonical text such as 10.0.0.0/8)")
	fl.StringArrayVar(&f.deny, "deny", nil, "address or CIDR refused (repeatable)")
	fl.StringArrayVar(&f.egresses, "egress", nil, "EGRESS_ID=DEST[,DEST...]: new TCP connections to these destinations leave through the Egress")
	fl.StringArrayVar(&f.resolvers, "resolver", nil, "RESOLVER_ID[@direct|@egress:EGRESS_ID]: DNS goes to this Resolver, directly (the default) or through a listed Egress")
	_ = cmd.MarkFlagRequired("mode")
}

func (f *policyFlags) policy() (*ctrlv1.NetworkPolicy, error) {
	mode, err := parseEnum[ctrlv1.NetworkPolicyMode]("mode", f.mode, "NETWORK_POLICY_MODE_", ctrlv1.NetworkPolicyMode_value, "deny-all or public-internet")
	if err != nil {
		return nil, err
	}
	p := &ctrlv1.NetworkPolicy{Mode: mode, Allow: f.allow, Deny: f.deny}
	for _, s := range f.egresses {
		id, dests, _ := strings.Cut(s, "=")
		if id == "" || dests == "" {
			return nil, fmt.Errorf("--egress %q: want EGRESS_ID=DEST[,DEST...]", s)
		}
		p.Egresses = append(p.Egresses, &ctrlv1.NetworkPolicyEgress{EgressId: id, Destinations: strings.Split(dests, ",")})
	}
	for _, s := range f.resolvers {
		r, err := parseResolver(s)
		if err != nil {
			return nil, err
		}
		p.Resolvers = append(p.Resolvers, r)
	}
	return p, nil
}

// parseResolver parses RESOLVER_ID, RESOLVER_ID@direct or
// RESOLVER_ID@egress:EGRESS_ID.
func parseResolver(s string) (*ctrlv1.NetworkPolicyResolver, error) {
	id, path, hasPath := strings.Cut(s, "@")
	egress, viaEgress := strings.CutPrefix(path, "egress:")
	r := &ctrlv1.NetworkPolicyResolver{ResolverId: id}
	switch {
	case id == "":
	case !hasPath || path == "direct":
		r.Path = &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_Direct{Direct: &ctrlv1.ResolverDirectPath{}}}
		return r, nil
	case viaEgress && egress != "":
		r.Path = &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_EgressId{EgressId: egress}}
		return r, nil
	}
	return nil, fmt.Errorf("--resolver %q: want RESOLVER_ID, RESOLVER_ID@direct or RESOLVER_ID@egress:EGRESS_ID", s)
}

// changeFlags are what every policy change takes besides the policy:
// the CAS revision, the drain and the command ID.
type changeFlags struct {
	expected  uint64
	drain     time.Duration
	seconds   uint32
	commandID *string
}

func (f *changeFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.Uint64Var(&f.expected, "expected-revision", 0, "policy revision the change applies to (default: the current one, read first)")
	fl.DurationVar(&f.drain, "drain", 0, "how long connections the change moves off their path keep running, in whole seconds up to 1h (default: the server's, 600s)")
	fl.Uint32Var(&f.seconds, "drain-seconds", 0, "--drain in seconds, 0 to 3600")
	cmd.MarkFlagsMutuallyExclusive("drain", "drain-seconds")
	f.commandID = commandFlag(cmd)
}

// drainSeconds returns the drain the flags ask for; nil selects the
// server's default.
func (f *changeFlags) drainSeconds(cmd *cobra.Command) (*uint32, error) {
	switch {
	case cmd.Flags().Changed("drain-seconds"):
		return &f.seconds, nil
	case !cmd.Flags().Changed("drain"):
		return nil, nil
	case f.drain < 0 || f.drain%time.Second != 0 || f.drain/time.Second > math.MaxUint32:
		return nil, fmt.Errorf("--drain %s: want whole seconds, such as 600s or 10m", f.drain)
	}
	s := uint32(f.drain / time.Second)
	return &s, nil
}

// replace builds the new policy of the Workspace id with edit and sends it
// as the replacement of the current one, unless --expected-revision names
// another, then shows the result. It reads the current policy first when
// edit needs it (read) or for its revision; edit gets nil when it did not.
func (f *changeFlags) replace(cmd *cobra.Command, c *conn, id string, read bool, edit func(current *ctrlv1.NetworkPolicy) (*ctrlv1.NetworkPolicy, error)) error {
	drain, err := f.drainSeconds(cmd)
	if err != nil {
		return err
	}
	cl, err := dial(cmd, c, ctrlv1connect.NewWorkspaceServiceClient)
	if err != nil {
		return err
	}
	var current *ctrlv1.NetworkPolicy
	expected := f.expected
	if read || !cmd.Flags().Changed("expected-revision") {
		got, err := call(cmd.Context(), cl.GetWorkspace, &ctrlv1.GetWorkspaceRequest{WorkspaceId: id})
		if err != nil {
			return err
		}
		current = got.GetWorkspace().GetSpec().GetNetworkPolicy()
		if !cmd.Flags().Changed("expected-revision") {
			expected = current.GetRevision()
		}
	}
	p, err := edit(current)
	if err != nil {
		return err
	}
	resp, err := call(cmd.Context(), cl.UpdateWorkspaceNetworkPolicy, &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
		Command: c.command(cmd, *f.commandID), WorkspaceId: id, ExpectedRevision: expected, Policy: p, DrainSeconds: drain,
	})
	if err != nil {
		return err
	}
	return showNetwork(cmd, c, resp, resp.GetWorkspace())
}

// policyRetryNote is help for the verbs that read the revision first.
const policyRetryNote = "Without --expected-revision the command first reads the current policy revision and\n" +
	"replaces that, so it overwrites any change made in between. When retrying with\n" +
	"--command-id, also pass --expected-revision."

func wsNetworkSetCommand(c *conn) *cobra.Command {
	var (
		f      policyFlags
		change changeFlags
	)
	cmd := &cobra.Command{
		Use: "set ID --mode deny-all|public-internet [--allow CIDR ...] [--deny CIDR ...] " +
			"[--egress EGRESS_ID=DEST[,DEST...]] [--resolver RESOLVER_ID[@direct|@egress:EGRESS_ID]] " +
			"[--drain DURATION | --drain-seconds N] [--expected-revision N]",
		Short: "Replace the whole network policy of a Workspace",
		Long: "Replace the whole network policy of a Workspace: flags left out are cleared, not kept.\n" +
			"Equal content keeps the revision; any other content increments it. Connections the\n" +
			"change moves off their path keep running for --drain.\n\n" + policyRetryNote + "\n\n" + networkHelp,
		Args: cobra.ExactArgs(1),
	}
	f.register(cmd)
	change.register(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		p, err := f.policy()
		if err != nil {
			return err
		}
		return change.replace(cmd, c, args[0], false, func(*ctrlv1.NetworkPolicy) (*ctrlv1.NetworkPolicy, error) { return p, nil })
	}
	return cmd
}

// wsNetworkListCommand builds `allow` and `deny`: a read-modify-write of
// one list of the current policy.
func wsNetworkListCommand(c *conn, verb string, list func(*ctrlv1.NetworkPolicy) *[]string) *cobra.Command {
	var (
		remove bool
		change changeFlags
	)
	cmd := &cobra.Command{
		Use:   verb + " ID CIDR... [--remove] [--drain DURATION | --drain-seconds N] [--expected-revision N]",
		Short: "Add entries to the " + verb + " list of a Workspace's network policy, or take them out",
		Long: "Read the current network policy, add the addresses or CIDRs to its " + verb + " list (those\n" +
			"already there are kept where they are) or with --remove take them out, and store the\n" +
			"result. The rest of the policy is sent back unchanged; DENY_ALL accepts no entries.\n\n" +
			policyRetryNote + " A retry then sends the same policy again, since entries\n" +
			"already added (or removed) are left as they are.\n\n" + networkHelp,
		Args: cobra.MinimumNArgs(2),
	}
	cmd.Flags().BoolVar(&remove, "remove", false, "take the entries out instead")
	change.register(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return change.replace(cmd, c, args[0], true, func(p *ctrlv1.NetworkPolicy) (*ctrlv1.NetworkPolicy, error) {
			if p == nil {
				return nil, fmt.Errorf("workspace %s has no network policy", args[0])
			}
			entries, l := args[1:], list(p)
			if remove {
				*l = slices.DeleteFunc(*l, func(e string) bool { return slices.Contains(entries, e) })
			} else {
				for _, e := range entries {
					if !slices.Contains(*l, e) {
						*l = append(*l, e)
					}
				}
			}
			return p, nil
		})
	}
	return cmd
}

// watchedNetwork is one line of `ws network watch`: what it shows of a
// Workspace, printed again only when it changes.
func watchedNetwork(ws *ctrlv1.Workspace) []string {
	st := ws.GetNetworkPolicyStatus()
	applied := "-"
	if st != nil {
		applied = decimal(st.GetAppliedRevision())
	}
	var egress, resolver []string
	for _, o := range ws.GetEgressObservations() {
		of, kind := egressFault(o)
		egress = append(egress, of+":"+kind)
	}
	for _, o := range ws.GetResolverObservations() {
		of, kind := resolverFault(o)
		resolver = append(resolver, of+":"+kind)
	}
	var paths []string
	for _, e := range st.GetEgresses() {
		paths = append(paths, pathRevisions(e.GetEgressId(), e.GetAppliedRevision(), e.GetDrainingRevision()))
	}
	for _, r := range st.GetResolvers() {
		paths = append(paths, pathRevisions(r.GetResolverId(), r.GetAppliedRevision(), r.GetDrainingRevision()))
	}
	return []string{
		timestamp(ws.GetUpdatedAt()),
		decimal(ws.GetSpec().GetNetworkPolicy().GetRevision()),
		applied,
		revisionCell(st.GetDrainingRevision()),
		orDash(strings.Join(paths, ",")),
		orDash(strings.Join(egress, ",")),
		orDash(strings.Join(resolver, ",")),
	}
}

// pathRevisions shows the revision of an Egress or Resolver its host
// applied, and the one still draining: ID@APPLIED, then (draining N).
func pathRevisions(id string, applied, draining uint64) string {
	cell := id + "@" + decimal(applied)
	if draining != 0 {
		cell += "(draining " + decimal(draining) + ")"
	}
	return cell
}

var watchedNetworkHeader = []string{"UPDATED", "REVISION", "APPLIED_REVISION", "DRAINING_REVISION", "PATHS", "EGRESS_FAULTS", "RESOLVER_FAULTS"}

func wsNetworkWatchCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "watch ID",
		Short: "Print a line whenever the network policy, what the host applied, or a fault changes, until Ctrl-C",
		Long: "Follow a Workspace and print a line whenever its policy revision, the applied or draining\n" +
			"revision its host confirmed (of the policy, and under PATHS of each Egress and Resolver, as\n" +
			"ID@APPLIED(draining N)), or the faults observed on its Egresses and Resolvers change.\n" +
			"With -o json each such line is the WatchWorkspaceResponse.\n\n" + networkHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var last []string
			return watchRows(cmd, c, args[0], watchedNetworkHeader, func(ws *ctrlv1.Workspace) []string {
				if ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
					return nil // its network is observed no more: the watch says it was deleted
				}
				cells := watchedNetwork(ws)
				// The time alone changes with every report of the host.
				if last != nil && slices.Equal(cells[1:], last[1:]) {
					return nil
				}
				last = cells
				return cells
			})
		},
	}
}

// showNetwork prints a response: with -o json the whole message, else the
// Workspace's network policy, status and faults.
func showNetwork(cmd *cobra.Command, c *conn, resp proto.Message, ws *ctrlv1.Workspace) error {
	if c.structured() {
		return c.writeMessage(cmd.OutOrStdout(), resp)
	}
	return writeNetwork(cmd.OutOrStdout(), ws)
}

// writeNetwork prints the policy as fields, then a table of its Egresses,
// one of its Resolvers and one of the faults, each only when not empty.
func writeNetwork(w io.Writer, ws *ctrlv1.Workspace) error {
	p, st := ws.GetSpec().GetNetworkPolicy(), ws.GetNetworkPolicyStatus()
	applied, appliedAt := "-", "-"
	if st != nil {
		applied, appliedAt = decimal(st.GetAppliedRevision()), timestamp(st.GetAppliedAt())
	}
	if err := writeFields(w, [][2]string{
		{"WORKSPACE", ws.GetWorkspaceId()},
		{"MODE", enumName(p.GetMode(), "NETWORK_POLICY_MODE_")},
		{"REVISION", decimal(p.GetRevision())},
		{"APPLIED_REVISION", applied},
		{"APPLIED_AT", appliedAt},
		{"DRAINING_REVISION", revisionCell(st.GetDrainingRevision())},
		{"ALLOW", orDash(strings.Join(p.GetAllow(), ","))},
		{"DENY", orDash(strings.Join(p.GetDeny(), ","))},
	}); err != nil {
		return err
	}
	if len(p.GetEgresses()) > 0 {
		egresses := table[*ctrlv1.NetworkPolicyEgress]{
			header: []string{"EGRESS", "DESTINATIONS", "APPLIED_REVISION", "DRAINING_REVISION"},
			row: func(e *ctrlv1.NetworkPolicyEgress) []string {
				i := slices.IndexFunc(st.GetEgresses(), func(s *ctrlv1.NetworkPolicyEgressStatus) bool { return s.GetEgressId() == e.GetEgressId() })
				var s *ctrlv1.NetworkPolicyEgressStatus
				if i >= 0 {
					s = st.GetEgresses()[i]
				}
				return []string{e.GetEgressId(), strings.Join(e.GetDestinations(), ","), revisionCell(s.GetAppliedRevision()), revisionCell(s.GetDrainingRevision())}
			},
		}
		if err := section(w, egresses, p.GetEgresses()); err != nil {
			return err
		}
	}
	if len(p.GetResolvers()) > 0 {
		resolvers := table[*ctrlv1.NetworkPolicyResolver]{
			header: []string{"RESOLVER", "PATH", "APPLIED_REVISION", "DRAINING_REVISION"},
			row: func(r *ctrlv1.NetworkPolicyResolver) []string {
				i := slices.IndexFunc(st.GetResolvers(), func(s *ctrlv1.NetworkPolicyResolverStatus) bool {
					return s.GetResolverId() == r.GetResolverId() && proto.Equal(s.GetPath(), r.GetPath())
				})
				var s *ctrlv1.NetworkPolicyResolverStatus
				if i >= 0 {
					s = st.GetResolvers()[i]
				}
				return []string{r.GetResolverId(), pathText(r.GetPath()), revisionCell(s.GetAppliedRevision()), revisionCell(s.GetDrainingRevision())}
			},
		}
		if err := section(w, resolvers, p.GetResolvers()); err != nil {
			return err
		}
	}
	var faults [][]string
	for _, o := range ws.GetEgressObservations() {
		of, kind := egressFault(o)
		faults = append(faults, []string{"egress", of, kind, timestamp(o.GetFailingSince()), timestamp(o.GetObservedAt()), orDash(o.GetError())})
	}
	for _, o := range ws.GetResolverObservations() {
		of, kind := resolverFault(o)
		faults = append(faults, []string{"resolver", of, kind, timestamp(o.GetFailingSince()), timestamp(o.GetObservedAt()), orDash(o.GetError())})
	}
	if len(faults) == 0 {
		return nil
	}
	return section(w, table[[]string]{
		header: []string{"FAULT", "OF", "KIND", "FAILING_SINCE", "OBSERVED_AT", "ERROR"},
		row:    func(cells []string) []string { return cells },
	}, faults)
}

// section writes a table after a blank line.
func section[R any](w io.Writer, t table[R], items []R) error {
	if _, err := fmt.Fprintln(w); err != nil {
		return err
	}
	return t.write(w, items, false)
}

// egressFault names the Egress an observation is about and its kind.
func egressFault(o *ctrlv1.EgressObservation) (of, kind string) {
	return o.GetEgressId(), enumName(o.GetKind(), "EGRESS_OBSERVATION_KIND_")
}

// resolverFault names the policy's resolvers entry an observation is
// about, as RESOLVER_ID@PATH, and its kind.
func resolverFault(o *ctrlv1.ResolverObservation) (of, kind string) {
	return o.GetResolverId() + "@" + pathText(o.GetPath()), enumName(o.GetKind(), "RESOLVER_OBSERVATION_KIND_")
}

// pathText is a ResolverPath as --resolver takes it: direct or
// egress:EGRESS_ID.
func pathText(p *ctrlv1.ResolverPath) string {
	switch k := p.GetKind().(type) {
	case *ctrlv1.ResolverPath_Direct:
		return "direct"
	case *ctrlv1.ResolverPath_EgressId:
		return "egress:" + k.EgressId
	}
	return "-"
}

// revisionCell shows a revision, or "-" for zero (none).
func revisionCell(rev uint64) string {
	if rev == 0 {
		return "-"
	}
	return decimal(rev)
}
