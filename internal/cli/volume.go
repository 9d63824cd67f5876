package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

type volumeClient = ctrlv1connect.VolumeServiceClient

func volumeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"vol"},
		Short:   "Manage Volumes: persistent filesystems a Workspace binds, which outlive it",
	}
	c := addConnFlags(cmd)
	cmd.AddCommand(
		volumeCreateCommand(c),
		volumes.getCommand(c),
		volumes.listCommand(c),
		volumeResizeCommand(c),
		volumeDeleteCommand(c),
		volumes.mapCommand(c, volumes.labels),
		volumes.mapCommand(c, volumes.annotations),
	)
	return cmd
}

var volumeTable = table[*ctrlv1.Volume]{
	header: []string{"ID", "STATE", "CAPACITY", "POOL", "WORKSPACE", "USED", "CONDITION", "LABELS", "AGE"},
	row: func(v *ctrlv1.Volume) []string {
		used, condition := "-", "-"
		if o := v.GetObservation(); o != nil {
			used = approxSize(o.GetUsedBytes())
			if o.GetCondition() != ctrlv1.VolumeCondition_VOLUME_CONDITION_UNSPECIFIED {
				condition = enumName(o.GetCondition(), "VOLUME_CONDITION_")
			}
		}
		return []string{
			v.GetVolumeId(),
			volumeStateCell(v),
			formatSize(v.GetSpec().GetCapacityBytes()),
			orDash(v.GetSpec().GetStoragePool()),
			orDash(v.GetBoundWorkspaceId()),
			used,
			condition,
			pairs(v.GetLabels()),
			age(v.GetCreatedAt()),
		}
	},
}

func volumeStateName(s ctrlv1.VolumeState) string { return enumName(s, "VOLUME_STATE_") }

// volumeStateCell is the state, with the failure reason when FAILED, and
// marked when the latest resize did not complete: FAILED(INTERNAL),
// AVAILABLE(RESIZE_FAILED).
func volumeStateCell(v *ctrlv1.Volume) string {
	s := volumeStateName(v.GetState())
	switch r := v.GetFailure().GetReason(); {
	case v.GetState() == ctrlv1.VolumeState_VOLUME_STATE_FAILED && r != ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED:
		s += "(" + enumName(r, "FAILURE_REASON_") + ")"
	case resizeFailed(v):
		s += "(RESIZE_FAILED)"
	}
	return s
}

// resizeFailed reports whether the Volume carries the failure of its latest
// ResizeVolume, which leaves it with its capacity in its state.
func resizeFailed(v *ctrlv1.Volume) bool {
	return v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_FAILED &&
		v.GetFailure().GetStage() == ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_VOLUME
}

// capacityHelp describes the SIZE of a Volume.
const capacityHelp = "SIZE is a whole number of MiB, written with a binary suffix such as 512Mi, 20Gi or 1Ti;\n" +
	"a decimal size such as 2G is refused."

func volumeCreateCommand(c *conn) *cobra.Command {
	var (
		size, pool string
		meta       metaFlags
		wait       waitFlags
	)
	cmd := &cobra.Command{
		Use:   "create [--size SIZE] [--pool NAME] [--label k=v ...] [--annotation k=v ...] [--wait [--timeout D]]",
		Short: "Create a Volume; with --wait, until it is AVAILABLE",
		Long: "Create a Volume: an ext4 filesystem of exactly --size in a storage pool, which outlives every\n" +
			"Workspace that binds it. The call returns once the Volume is stored, in CREATING; a host that\n" +
			"reaches the pool then creates the filesystem and the Volume becomes AVAILABLE. Bind it with\n" +
			"`ws create --volume ID` or `ws volume`.\n\n" +
			capacityHelp + "\nWithout --size, or with 0, the Volume gets its storage pool's profile capacity.",
		Args: cobra.NoArgs,
	}
	cmd.Flags().StringVar(&size, "size", "0", "capacity, SIZE in whole MiB (0: the storage pool's profile)")
	cmd.Flags().StringVar(&pool, "pool", "", "storage pool (default: the deployment's default pool)")
	meta.register(cmd)
	wait.registerUntil(cmd, "the Volume until it is AVAILABLE")
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		capacity, err := parseMiB("--size", size)
		if err != nil {
			return err
		}
		labels, annotations, err := meta.parse()
		if err != nil {
			return err
		}
		return volumeWrite(cmd, c, *commandID, wait, untilVolumeCreated, func(ctx context.Context, cl volumeClient, meta *ctrlv1.CommandMetadata) (proto.Message, *ctrlv1.Volume, error) {
			return carrying(ctx, cl.CreateVolume, &ctrlv1.CreateVolumeRequest{
				Command:     meta,
				Spec:        &ctrlv1.VolumeSpec{CapacityBytes: capacity, StoragePool: pool},
				Labels:      labels,
				Annotations: annotations,
			}, (*ctrlv1.CreateVolumeResponse).GetVolume)
		})
	}
	return cmd
}

func volumeResizeCommand(c *conn) *cobra.Command {
	var wait waitFlags
	cmd := &cobra.Command{
		Use:   "resize ID SIZE [--wait [--timeout D]]",
		Short: "Grow a Volume to SIZE; a Volume never shrinks",
		Long: "Grow a Volume to SIZE; a smaller SIZE is refused and an equal one changes nothing.\n" + capacityHelp + "\n\n" +
			"An AVAILABLE Volume is RESIZING until its host grew it, and no Workspace bound to it starts\n" +
			"meanwhile. An ATTACHED Volume, whose Workspace runs, grows online where its host allows that;\n" +
			"where it does not, the call is refused and says why: stop the Workspace and resize again.\n" +
			"A resize that fails leaves the Volume with its capacity and shows as RESIZE_FAILED.",
		Args: cobra.ExactArgs(2),
	}
	wait.registerUntil(cmd, "the Volume until it has grown")
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		capacity, err := parseMiB("SIZE", args[1])
		if err != nil {
			return err
		}
		return volumeWrite(cmd, c, *commandID, wait, untilVolumeGrown, func(ctx context.Context, cl volumeClient, meta *ctrlv1.CommandMetadata) (proto.Message, *ctrlv1.Volume, error) {
			return carrying(ctx, cl.ResizeVolume, &ctrlv1.ResizeVolumeRequest{Command: meta, VolumeId: args[0], CapacityBytes: capacity}, (*ctrlv1.ResizeVolumeResponse).GetVolume)
		})
	}
	return cmd
}

func volumeDeleteCommand(c *conn) *cobra.Command {
	var wait waitFlags
	cmd := &cobra.Command{
		Use:   "delete ID [--wait [--timeout D]]",
		Short: "Delete a Volume and its data; refused while a Workspace binds it",
		Long: "Delete a Volume that no Workspace binds: release it first with `ws volume WORKSPACE none`, or\n" +
			"delete that Workspace. The Volume is DELETING until its host removed the data, then DELETED;\n" +
			"a LOST Volume is DELETED at once. A deleted Volume stays readable with its labels and\n" +
			"annotations.",
		Args: cobra.ExactArgs(1),
	}
	wait.registerUntil(cmd, "the Volume until it is DELETED")
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return volumeWrite(cmd, c, *commandID, wait, untilVolumeDeleted, func(ctx context.Context, cl volumeClient, meta *ctrlv1.CommandMetadata) (proto.Message, *ctrlv1.Volume, error) {
			return carrying(ctx, cl.DeleteVolume, &ctrlv1.DeleteVolumeRequest{Command: meta, VolumeId: args[0]}, (*ctrlv1.DeleteVolumeResponse).GetVolume)
		})
	}
	return cmd
}

// volumeWrite makes the call of a write on a Volume, shows the response and,
// with --wait, follows the Volume until g.
func volumeWrite(cmd *cobra.Command, c *conn, commandID string, wait waitFlags, g volumeGoal,
	do func(ctx context.Context, cl volumeClient, meta *ctrlv1.CommandMetadata) (proto.Message, *ctrlv1.Volume, error)) error {
	cl, err := dial(cmd, c, ctrlv1connect.NewVolumeServiceClient)
	if err != nil {
		return err
	}
	resp, v, err := do(cmd.Context(), cl, c.command(cmd, commandID))
	if err != nil {
		return err
	}
	if err := show(cmd, c, resp, volumeTable, v); err != nil {
		return err
	}
	if !wait.wait {
		return nil
	}
	return waitVolume(cmd.Context(), cl, v, g, wait.timeout, newStatusLine(cmd.ErrOrStderr()))
}

// volumeGoal is where a --wait on a Volume ends.
type volumeGoal struct {
	until string               // completes "waiting for the Volume to ..."
	via   []ctrlv1.VolumeState // states polled through
	ok    []ctrlv1.VolumeState // states the wait ends well in
	// resize fails the wait when the Volume carries a resize failure.
	resize bool
}

var (
	untilVolumeCreated = volumeGoal{
		until: "become AVAILABLE",
		via:   []ctrlv1.VolumeState{ctrlv1.VolumeState_VOLUME_STATE_CREATING, ctrlv1.VolumeState_VOLUME_STATE_UNKNOWN},
		ok:    []ctrlv1.VolumeState{ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE, ctrlv1.VolumeState_VOLUME_STATE_ATTACHED},
	}
	untilVolumeGrown = volumeGoal{
		until:  "grow",
		via:    []ctrlv1.VolumeState{ctrlv1.VolumeState_VOLUME_STATE_RESIZING, ctrlv1.VolumeState_VOLUME_STATE_UNKNOWN},
		ok:     []ctrlv1.VolumeState{ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE, ctrlv1.VolumeState_VOLUME_STATE_ATTACHED},
		resize: true,
	}
	untilVolumeDeleted = volumeGoal{
		until: "become DELETED",
		via:   []ctrlv1.VolumeState{ctrlv1.VolumeState_VOLUME_STATE_DELETING, ctrlv1.VolumeState_VOLUME_STATE_UNKNOWN},
		ok:    []ctrlv1.VolumeState{ctrlv1.VolumeState_VOLUME_STATE_DELETED},
	}
)

// check says whether a Volume that left g.via reached g, and why not.
func (g volumeGoal) check(v *ctrlv1.Volume) error {
	f := v.GetFailure()
	switch s := v.GetState(); {
	case s == ctrlv1.VolumeState_VOLUME_STATE_FAILED:
		return fmt.Errorf("volume %s FAILED: %s", v.GetVolumeId(), failureText(f.GetReason(), f.GetStage(), f.GetMessage()))
	case g.resize && resizeFailed(v):
		return fmt.Errorf("volume %s did not grow: %s; it stays %s at %s", v.GetVolumeId(),
			failureText(f.GetReason(), f.GetStage(), f.GetMessage()), volumeStateName(s), formatSize(v.GetSpec().GetCapacityBytes()))
	case !slices.Contains(g.ok, s):
		return fmt.Errorf("volume %s is %s and will not %s", v.GetVolumeId(), volumeStateName(s), g.until)
	}
	return nil
}

// Polling of a --wait on a Volume, which has no watch: the first poll comes
// soon, as most changes are quick, and the delay doubles up to the last.
const (
	firstVolumePoll = 100 * time.Millisecond
	lastVolumePoll  = 2 * time.Second
)

// waitVolume polls GetVolume from the state the call returned for as long
// as the Volume is in g.via. It reports state changes as lines on out and,
// on a terminal, how long the current state has lasted; it returns an error
// that says why when the Volume did not reach g or timeout passed.
func waitVolume(ctx context.Context, cl volumeClient, v *ctrlv1.Volume, g volumeGoal, timeout time.Duration, out *statusLine) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer out.end()
	id := v.GetVolumeId()
	since := time.Now()
	timedOut := func() error {
		return fmt.Errorf("timed out after %s waiting for volume %s to %s; it is %s (wait longer with --timeout, or check it with `volume get`)",
			timeout, id, g.until, volumeStateName(v.GetState()))
	}
	for delay := firstVolumePoll; slices.Contains(g.via, v.GetState()); delay = min(2*delay, lastVolumePoll) {
		out.update(fmt.Sprintf("volume %s: %s for %s", id, volumeStateName(v.GetState()), elapsed(time.Since(since))))
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return timedOut()
		case <-time.After(delay):
		}
		resp, err := call(wctx, cl.GetVolume, &ctrlv1.GetVolumeRequest{VolumeId: id})
		switch {
		case err == nil:
		case slices.Contains(g.ok, ctrlv1.VolumeState_VOLUME_STATE_DELETED) && connect.CodeOf(err) == connect.CodeNotFound:
			return nil // gone altogether
		case ctx.Err() == nil && errors.Is(wctx.Err(), context.DeadlineExceeded):
			return timedOut()
		default:
			return err
		}
		next := resp.GetVolume()
		if from, to := v.GetState(), next.GetState(); from != to {
			now := time.Now()
			out.println(fmt.Sprintf("%s → %s in %s", volumeStateName(from), volumeStateCell(next), elapsed(now.Sub(since))))
			since = now
		}
		v = next
	}
	return g.check(v)
}

var volumes = kind[volumeClient, *ctrlv1.VolumeSpec, *ctrlv1.Volume]{
	name:      "volume",
	plural:    "volumes",
	newClient: ctrlv1connect.NewVolumeServiceClient,
	table:     volumeTable,
	// Only get, list, label and annotate are built from the kind; create,
	// resize and delete take sizes and --wait.

	get: func(ctx context.Context, cl volumeClient, id string) (proto.Message, *ctrlv1.Volume, error) {
		return carrying(ctx, cl.GetVolume, &ctrlv1.GetVolumeRequest{VolumeId: id}, (*ctrlv1.GetVolumeResponse).GetVolume)
	},
	list: func(ctx context.Context, cl volumeClient, q listQuery) ([]*ctrlv1.Volume, string, error) {
		return listed(ctx, cl.ListVolumes, &ctrlv1.ListVolumesRequest{PageSize: q.pageSize, PageToken: q.pageToken, LabelSelector: q.selector}, (*ctrlv1.ListVolumesResponse).GetVolumes)
	},
	listResponse: func(items []*ctrlv1.Volume, next string) proto.Message {
		return &ctrlv1.ListVolumesResponse{Volumes: items, NextPageToken: next}
	},
	labels: labelField((*ctrlv1.Volume).GetLabelsRevision, func(ctx context.Context, cl volumeClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Volume, error) {
		return carrying(ctx, cl.UpdateVolumeLabels, &ctrlv1.UpdateVolumeLabelsRequest{Command: cmd, VolumeId: id, ExpectedLabelsRevision: expected, Labels: m}, (*ctrlv1.UpdateVolumeLabelsResponse).GetVolume)
	}),
	annotations: annotationField((*ctrlv1.Volume).GetAnnotationsRevision, func(ctx context.Context, cl volumeClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Volume, error) {
		return carrying(ctx, cl.UpdateVolumeAnnotations, &ctrlv1.UpdateVolumeAnnotationsRequest{Command: cmd, VolumeId: id, ExpectedAnnotationsRevision: expected, Annotations: m}, (*ctrlv1.UpdateVolumeAnnotationsResponse).GetVolume)
	}),
}
