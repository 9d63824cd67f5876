package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

type wsClient = ctrlv1connect.WorkspaceServiceClient

// defaultMemory is the memory a Workspace gets without --memory.
const defaultMemory = "512Mi"

func wsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "ws",
		Aliases: []string{"workspace"},
		Short:   "Manage Workspaces: isolated Linux environments created from a Template revision",
	}
	c := addConnFlags(cmd)
	cmd.AddCommand(
		wsCreateCommand(c),
		workspaces.getCommand(c),
		workspaces.listCommand(c),
		wsWatchCommand(c),
		wsStartCommand(c),
		wsStopCommand(c),
		wsDeleteCommand(c),
		workspaces.mapCommand(c, workspaces.labels),
		workspaces.mapCommand(c, workspaces.annotations),
		wsExpireCommand(c),
		wsMemoryCommand(c),
		wsDiskCommand(c),
		wsVolumeCommand(c),
		wsNetworkCommand(c),
		wsDescribeCommand(c),
		wsExecCommand(c),
		wsCpCommand(c),
		wsPsCommand(c),
		wsLogsCommand(c),
		wsTopCommand(c),
		wsPortForwardCommand(c),
		wsExposeCommand(c),
		wsExposuresCommand(c),
		wsExportCommand(c),
		wsScreenshotCommand(c),
		wsInputCommand(c),
	)
	return cmd
}

// diskCell is the writable layer's size: as asked for, or, where the
// request left it to the host's profile, the capacity the layer has
// (the BEST_EFFORT tier's; "default" until the layer exists).
func diskCell(w *ctrlv1.Workspace) string {
	if n := w.GetSpec().GetResources().GetWritableLayerBytes(); n > 0 {
		return formatSize(n)
	}
	for _, t := range w.GetRetentionTiers() {
		if t.GetKind() == ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT && t.CapacityBytes != nil {
			return formatSize(t.GetCapacityBytes())
		}
	}
	return "default"
}

var workspaceTable = table[*ctrlv1.Workspace]{
	header: []string{"ID", "STATE", "GEN", "TEMPLATE", "CPU", "MEMORY", "DISK", "VOLUME", "LABELS", "AGE"},
	row: func(w *ctrlv1.Workspace) []string {
		s := w.GetSpec()
		r := s.GetResources()
		return []string{
			w.GetWorkspaceId(),
			stateCell(w),
			decimal(w.GetGeneration()),
			templateRef(s.GetTemplate()),
			cpuCell(r.GetCpuMillis()),
			formatSize(r.GetMemoryBytes()),
			diskCell(w),
			bindingCell(s.GetVolume()),
			pairs(w.GetLabels()),
			age(w.GetCreatedAt()),
		}
	},
	wideHeader: []string{"NETWORK", "EXPIRES", "ACTION", "ANNOTATIONS"},
	wideRow: func(w *ctrlv1.Workspace) []string {
		exp := w.GetExpiration().GetPolicy()
		action := "-"
		if exp != nil {
			action = enumName(exp.GetAction(), "WORKSPACE_EXPIRATION_ACTION_")
		}
		return []string{
			enumName(w.GetSpec().GetNetworkPolicy().GetMode(), "NETWORK_POLICY_MODE_"),
			timestamp(exp.GetDeadline()),
			action,
			annotationCell(w.GetAnnotations()),
		}
	},
}

func stateName(s ctrlv1.WorkspaceState) string { return enumName(s, "WORKSPACE_STATE_") }

// stateCell is the state, with the failure reason when FAILED:
// FAILED(TIMED_OUT).
func stateCell(w *ctrlv1.Workspace) string {
	s := stateName(w.GetState())
	if r := w.GetFailure().GetReason(); w.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED && r != ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
		s += "(" + enumName(r, "FAILURE_REASON_") + ")"
	}
	return s
}

func templateRef(t *ctrlv1.TemplateRef) string {
	if t.GetTemplateId() == "" {
		return "-"
	}
	return t.GetTemplateId() + "@" + t.GetRevision()
}

// cpuCell formats thousandths of a core as Kubernetes does: 500m, 2.
func cpuCell(millis uint32) string {
	switch {
	case millis == 0:
		return "-"
	case millis%1000 == 0:
		return strconv.FormatUint(uint64(millis/1000), 10)
	default:
		return strconv.FormatUint(uint64(millis), 10) + "m"
	}
}

// wsCreateFlags describe a WorkspaceCreateSpec.
type wsCreateFlags struct {
	template     string
	cpu          uint32
	memory, disk string
	network      string
	volume       string
	keepVolume   bool
	deleteVolume bool
	expire       expireFlags
	require      []string
}

func (f *wsCreateFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.template, "template", "", "Template to create from, ID or ID@REVISION (default: the built-in base; without @REVISION its default revision)")
	fl.Uint32Var(&f.cpu, "cpu", 0, "CPU share in thousandths of a core (0: the server's default)")
	fl.StringVar(&f.memory, "memory", defaultMemory, "guest RAM, SIZE, a whole number of MiB and at least 128Mi")
	fl.StringVar(&f.disk, "disk", "0", "capacity of the writable layer, SIZE in whole MiB (0: the host's default)")
	fl.StringVar(&f.network, "network", "", "network policy mode: deny-all or public-internet (default: deny-all)")
	fl.StringVar(&f.volume, "volume", "", "Volume to bind: NEW[:PATH], VOLUME_ID[:PATH] or none (default: none); PATH defaults to "+defaultMountPath)
	fl.BoolVar(&f.keepVolume, "keep-volume", false, "keep the Volume when the Workspace is deleted (the default for VOLUME_ID)")
	fl.BoolVar(&f.deleteVolume, "delete-volume", false, "delete the Volume with the Workspace (the default for NEW)")
	cmd.MarkFlagsMutuallyExclusive("keep-volume", "delete-volume")
	fl.DurationVar(&f.expire.in, "expire-in", 0, "expire this long after now, such as 2h")
	fl.StringVar(&f.expire.at, "expire-at", "", "expire at this RFC 3339 time, such as 2025-03-01T12:00:00Z")
	fl.StringVar(&f.expire.action, "expire-action", "", "what expiring does: stop or delete (default: stop)")
	cmd.MarkFlagsMutuallyExclusive("expire-in", "expire-at")
	fl.StringSliceVar(&f.require, "require", nil, "capabilities the host must offer, comma-separated or repeated: screen and input (with a template that carries a display, such as desktop), volume.storage_pool, runtime.gvisor")
}

func (f *wsCreateFlags) spec() (*ctrlv1.WorkspaceCreateSpec, error) {
	spec := &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: f.cpu}}
	if f.template != "" {
		sel, err := parseTemplateSelector(f.template)
		if err != nil {
			return nil, err
		}
		spec.Template = sel
	}
	var err error
	if spec.Resources.MemoryBytes, err = parseSize("--memory", f.memory); err != nil {
		return nil, err
	}
	if spec.Resources.WritableLayerBytes, err = parseSize("--disk", f.disk); err != nil {
		return nil, err
	}
	if f.network != "" {
		mode, err := parseEnum[ctrlv1.NetworkPolicyMode]("network", f.network, "NETWORK_POLICY_MODE_", ctrlv1.NetworkPolicyMode_value, "deny-all or public-internet")
		if err != nil {
			return nil, err
		}
		spec.NetworkPolicy = &ctrlv1.NetworkPolicy{Mode: mode}
	}
	if spec.Volume, err = f.binding(); err != nil {
		return nil, err
	}
	if spec.Expiration, err = f.expire.policy("expire-"); err != nil {
		return nil, err
	}
	if len(f.require) > 0 {
		spec.Capabilities = &ctrlv1.CapabilityRequirements{Required: f.require}
	}
	return spec, nil
}

// binding returns the binding --volume asks for, nil without it, which the
// server takes as none.
func (f *wsCreateFlags) binding() (*ctrlv1.WorkspaceVolumeBinding, error) {
	explicit := f.keepVolume || f.deleteVolume
	if f.volume == "" {
		if explicit {
			return nil, errors.New("--keep-volume and --delete-volume need --volume NEW or VOLUME_ID")
		}
		return nil, nil
	}
	b, err := parseBinding("--volume", f.volume, true)
	if err != nil || !explicit {
		return b, err
	}
	if isNone(b) {
		return nil, errors.New("--keep-volume and --delete-volume need --volume NEW or VOLUME_ID, not none")
	}
	b.DeleteWithWorkspace = proto.Bool(f.deleteVolume)
	return b, nil
}

// parseTemplateSelector parses ID or ID@REVISION.
func parseTemplateSelector(s string) (*ctrlv1.TemplateSelector, error) {
	id, rev, hasRev := strings.Cut(s, "@")
	if id == "" || (hasRev && rev == "") {
		return nil, fmt.Errorf("--template %q: want ID or ID@REVISION", s)
	}
	return &ctrlv1.TemplateSelector{TemplateId: id, Revision: rev}, nil
}

// expireFlags are a deadline, relative or absolute, and its action.
type expireFlags struct {
	in     time.Duration
	at     string
	action string
}

// policy returns the policy the flags describe, nil when they give no
// deadline. prefix is what the flag names start with: "expire-" on create,
// "" on expire.
func (f *expireFlags) policy(prefix string) (*ctrlv1.WorkspaceExpirationPolicy, error) {
	var deadline time.Time
	switch {
	case f.at != "":
		t, err := time.Parse(time.RFC3339, f.at)
		if err != nil {
			return nil, fmt.Errorf("--%sat %q: want an RFC 3339 time such as 2025-03-01T12:00:00Z", prefix, f.at)
		}
		deadline = t
	case f.in < 0:
		return nil, fmt.Errorf("--%sin %s: want a positive duration", prefix, f.in)
	case f.in > 0:
		deadline = time.Now().Add(f.in)
	case f.action != "":
		return nil, fmt.Errorf("--%saction needs a deadline: --%sin or --%sat", prefix, prefix, prefix)
	default:
		return nil, nil
	}
	action := ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_STOP
	if f.action != "" {
		a, err := parseEnum[ctrlv1.WorkspaceExpirationAction](prefix+"action", f.action, "WORKSPACE_EXPIRATION_ACTION_", ctrlv1.WorkspaceExpirationAction_value, "stop or delete")
		if err != nil {
			return nil, err
		}
		action = a
	}
	return &ctrlv1.WorkspaceExpirationPolicy{Deadline: timestamppb.New(deadline), Action: action}, nil
}

// expireRetryNote is help for the verbs that take a relative deadline.
const expireRetryNote = "A relative deadline is turned into a time when the command runs: when retrying with\n" +
	"--command-id, give the deadline as an RFC 3339 time so that the retry sends the same input."

func wsCreateCommand(c *conn) *cobra.Command {
	var (
		f    wsCreateFlags
		meta metaFlags
		wait waitFlags
	)
	cmd := &cobra.Command{
		Use: "create [--template ID[@REVISION]] [--cpu MILLIS] [--memory SIZE] [--disk SIZE] " +
			"[--network deny-all|public-internet] [--volume NEW[:PATH]|VOLUME_ID[:PATH]|none [--keep-volume|--delete-volume]] " +
			"[--expire-in DURATION | --expire-at RFC3339] [--expire-action stop|delete] " +
			"[--label k=v ...] [--annotation k=v ...] [--wait [--timeout D]]",
		Short: "Create a Workspace; with --wait, until it is AVAILABLE",
		Long: "Create a Workspace. The call returns once the Workspace is stored, in CREATING; it then\n" +
			"waits for its Template to be delivered to its host and starts. --wait follows it there: the\n" +
			"response goes to stdout first, the progress to stderr.\n\n" +
			"--volume NEW[:PATH] creates a Volume, of its storage pool's profile capacity, with the\n" +
			"Workspace; deleting the Workspace deletes it too unless --keep-volume.\n" +
			bindingHelp + "\n" +
			"Deleting the Workspace keeps a bound VOLUME_ID unless --delete-volume. Without --volume the\n" +
			"Workspace binds none; `ws volume` binds one later.\n\n" +
			sizeHelp + "\n\n" + expireRetryNote,
		Args: cobra.NoArgs,
	}
	f.register(cmd)
	meta.register(cmd)
	wait.register(cmd, untilAvailable)
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		spec, err := f.spec()
		if err != nil {
			return err
		}
		labels, annotations, err := meta.parse()
		if err != nil {
			return err
		}
		cl, err := dial(cmd, c, ctrlv1connect.NewWorkspaceServiceClient)
		if err != nil {
			return err
		}
		resp, err := call(cmd.Context(), cl.CreateWorkspace, &ctrlv1.CreateWorkspaceRequest{
			Command: c.command(cmd, *commandID), Spec: spec, Labels: labels, Annotations: annotations,
		})
		if err != nil {
			return err
		}
		if err := show(cmd, c, resp, workspaceTable, resp.GetWorkspace()); err != nil {
			return err
		}
		return wait.run(cmd, cl, resp.GetWorkspace(), untilAvailable)
	}
	return cmd
}

// wsCall is the call of a lifecycle verb on one Workspace.
type wsCall func(ctx context.Context, cl wsClient, meta *ctrlv1.CommandMetadata, id string) (proto.Message, *ctrlv1.Workspace, error)

// wsLifecycle completes start, stop and delete: one call on the Workspace
// ID, the response shown, and with --wait a watch until the goal.
func wsLifecycle(c *conn, cmd *cobra.Command, g goal, do wsCall) *cobra.Command {
	var wait waitFlags
	wait.register(cmd, g)
	commandID := commandFlag(cmd)
	cmd.Args = cobra.ExactArgs(1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := dial(cmd, c, ctrlv1connect.NewWorkspaceServiceClient)
		if err != nil {
			return err
		}
		resp, ws, err := do(cmd.Context(), cl, c.command(cmd, *commandID), args[0])
		if err != nil {
			return err
		}
		if err := show(cmd, c, resp, workspaceTable, ws); err != nil {
			return err
		}
		return wait.run(cmd, cl, ws, g)
	}
	return cmd
}

func wsStartCommand(c *conn) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "start ID [--wait [--timeout D]]",
		Short: "Start a STOPPED Workspace, or retry the launch of a FAILED one",
	}
	return wsLifecycle(c, cmd, untilAvailable, func(ctx context.Context, cl wsClient, meta *ctrlv1.CommandMetadata, id string) (proto.Message, *ctrlv1.Workspace, error) {
		return carrying(ctx, cl.StartWorkspace, &ctrlv1.StartWorkspaceRequest{Command: meta, WorkspaceId: id}, (*ctrlv1.StartWorkspaceResponse).GetWorkspace)
	})
}

func wsStopCommand(c *conn) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "stop ID [--force] [--wait [--timeout D]]",
		Short: "Stop a Workspace; its writable layer stays on its host for the next start",
		Long: "Stop a Workspace. A normal stop syncs the guest and ends its processes with a grace\n" +
			"period; --force ends the execution at once, without confirming writeback, and also\n" +
			"escalates a normal stop in progress or releases a Workspace whose host is lost.",
	}
	force := cmd.Flags().Bool("force", false, "end the execution at once (STOP_MODE_FORCE)")
	return wsLifecycle(c, cmd, untilStopped, func(ctx context.Context, cl wsClient, meta *ctrlv1.CommandMetadata, id string) (proto.Message, *ctrlv1.Workspace, error) {
		mode := ctrlv1.StopMode_STOP_MODE_NORMAL
		if *force {
			mode = ctrlv1.StopMode_STOP_MODE_FORCE
		}
		return carrying(ctx, cl.StopWorkspace, &ctrlv1.StopWorkspaceRequest{Command: meta, WorkspaceId: id, Mode: mode}, (*ctrlv1.StopWorkspaceResponse).GetWorkspace)
	})
}

func wsDeleteCommand(c *conn) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete ID [--wait [--timeout D]]",
		Short: "Delete a Workspace, its writable layer and, when the binding says so, its Volume",
	}
	return wsLifecycle(c, cmd, untilDeleted, func(ctx context.Context, cl wsClient, meta *ctrlv1.CommandMetadata, id string) (proto.Message, *ctrlv1.Workspace, error) {
		return carrying(ctx, cl.DeleteWorkspace, &ctrlv1.DeleteWorkspaceRequest{Command: meta, WorkspaceId: id}, (*ctrlv1.DeleteWorkspaceResponse).GetWorkspace)
	})
}

func wsExpireCommand(c *conn) *cobra.Command {
	var (
		f        expireFlags
		clearAll bool
	)
	cmd := &cobra.Command{
		Use:   "expire ID (--in DURATION | --at RFC3339 | --clear) [--action stop|delete]",
		Short: "Set or clear the expiration of a Workspace",
		Long: "Set the deadline at which the Workspace is stopped (the default) or deleted, replacing any\n" +
			"earlier one, or clear it.\n\n" + expireRetryNote,
		Args: cobra.ExactArgs(1),
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.in, "in", 0, "expire this long after now, such as 2h")
	fl.StringVar(&f.at, "at", "", "expire at this RFC 3339 time")
	fl.BoolVar(&clearAll, "clear", false, "remove the expiration")
	fl.StringVar(&f.action, "action", "", "what expiring does: stop or delete (default: stop)")
	cmd.MarkFlagsMutuallyExclusive("in", "at", "clear")
	cmd.MarkFlagsOneRequired("in", "at", "clear")
	cmd.MarkFlagsMutuallyExclusive("clear", "action")
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		change := &ctrlv1.WorkspaceExpirationChange{Change: &ctrlv1.WorkspaceExpirationChange_Clear{Clear: &emptypb.Empty{}}}
		if !clearAll {
			p, err := f.policy("")
			if err != nil {
				return err
			}
			if p == nil { // --in 0
				return errors.New("--in 0: want a positive duration")
			}
			change.Change = &ctrlv1.WorkspaceExpirationChange_Set{Set: p}
		}
		resp, err := dialCall(cmd, c, ctrlv1connect.NewWorkspaceServiceClient, ctrlv1connect.WorkspaceServiceClient.UpdateWorkspaceExpiration, &ctrlv1.UpdateWorkspaceExpirationRequest{
			Command: c.command(cmd, *commandID), WorkspaceId: args[0], Change: change,
		})
		if err != nil {
			return err
		}
		return show(cmd, c, resp, workspaceTable, resp.GetWorkspace())
	}
	return cmd
}

func wsWatchCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "watch ID",
		Short: "Print the Workspace and then every change of it, until it is DELETED or Ctrl-C",
		Long: "Print the Workspace and then every change of it as a table row, or with -o json as one\n" +
			"WatchWorkspaceResponse per line. Changes that arrive faster than they are read are\n" +
			"coalesced by the server: the latest state is shown, not every intermediate one.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return watchRows(cmd, c, args[0], workspaceTable.header, workspaceTable.row)
		},
	}
}

// watchRows follows WatchWorkspace on the Workspace id until the stream
// ends or Ctrl-C, and prints each response for which row returns cells:
// with -o json the response as one line, else the cells as a table row
// under header.
func watchRows(cmd *cobra.Command, c *conn, id string, header []string, row func(*ctrlv1.Workspace) []string) error {
	cl, err := dial(cmd, c, ctrlv1connect.NewWorkspaceServiceClient)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	stream, err := cl.WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		return err
	}
	defer stream.Close()
	rows := &rowWriter{w: cmd.OutOrStdout(), header: header}
	for stream.Receive() {
		ws := stream.Msg().GetWorkspace()
		cells := row(ws)
		if cells == nil {
			if ws.GetState() == ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
				// The stream ends with it: say why the watch ends.
				fmt.Fprintf(cmd.ErrOrStderr(), "workspace %s was deleted\n", id)
			}
			continue
		}
		if c.structured() {
			b, err := marshalJSON(stream.Msg(), "")
			if err != nil {
				return err
			}
			if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b); err != nil {
				return err
			}
		} else if err := rows.write(cells); err != nil {
			return err
		}
	}
	if ctx.Err() != nil { // interrupted: Main says so, and exits 128 plus the signal
		return ctx.Err()
	}
	return stream.Err()
}

var workspaces = kind[wsClient, *ctrlv1.WorkspaceCreateSpec, *ctrlv1.Workspace]{
	name:      "workspace",
	plural:    "workspaces",
	newClient: ctrlv1connect.NewWorkspaceServiceClient,
	table:     workspaceTable,
	// Only get, list, label and annotate are built from the kind; create,
	// update and delete differ from those of egress and resolver.

	get: func(ctx context.Context, cl wsClient, id string) (proto.Message, *ctrlv1.Workspace, error) {
		return carrying(ctx, cl.GetWorkspace, &ctrlv1.GetWorkspaceRequest{WorkspaceId: id}, (*ctrlv1.GetWorkspaceResponse).GetWorkspace)
	},
	list: func(ctx context.Context, cl wsClient, q listQuery) ([]*ctrlv1.Workspace, string, error) {
		return listed(ctx, cl.ListWorkspaces, &ctrlv1.ListWorkspacesRequest{PageSize: q.pageSize, PageToken: q.pageToken, LabelSelector: q.selector}, (*ctrlv1.ListWorkspacesResponse).GetWorkspaces)
	},
	listResponse: func(items []*ctrlv1.Workspace, next string) proto.Message {
		return &ctrlv1.ListWorkspacesResponse{Workspaces: items, NextPageToken: next}
	},
	labels: labelField((*ctrlv1.Workspace).GetLabelsRevision, func(ctx context.Context, cl wsClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Workspace, error) {
		return carrying(ctx, cl.UpdateWorkspaceLabels, &ctrlv1.UpdateWorkspaceLabelsRequest{Command: cmd, WorkspaceId: id, ExpectedLabelsRevision: expected, Labels: m}, (*ctrlv1.UpdateWorkspaceLabelsResponse).GetWorkspace)
	}),
	annotations: annotationField((*ctrlv1.Workspace).GetAnnotationsRevision, func(ctx context.Context, cl wsClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Workspace, error) {
		return carrying(ctx, cl.UpdateWorkspaceAnnotations, &ctrlv1.UpdateWorkspaceAnnotationsRequest{Command: cmd, WorkspaceId: id, ExpectedAnnotationsRevision: expected, Annotations: m}, (*ctrlv1.UpdateWorkspaceAnnotationsResponse).GetWorkspace)
	}),
}
