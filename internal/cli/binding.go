package cli

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// defaultMountPath is where the server mounts a Volume bound without a PATH.
const defaultMountPath = "/data"

// bindingHelp describes the binding syntax of ws create --volume and ws volume.
const bindingHelp = "VOLUME_ID[:PATH] binds an existing Volume; none binds no Volume. PATH is the absolute\n" +
	"guest path the Volume is mounted at (default " + defaultMountPath + ")."

// parseBinding parses NEW[:PATH], VOLUME_ID[:PATH] or none, in what
// ("--volume", "argument") for errors. NEW, in any case, is accepted only
// when allowNew (CreateWorkspace is the only call that takes it). The
// returned binding leaves delete_with_workspace unset.
func parseBinding(what, s string, allowNew bool) (*ctrlv1.WorkspaceVolumeBinding, error) {
	want := "VOLUME_ID[:PATH] or none"
	if allowNew {
		want = "NEW[:PATH], " + want
	}
	id, mount, hasPath := strings.Cut(s, ":")
	switch {
	case id == "":
		return nil, fmt.Errorf("%s %q: want %s", what, s, want)
	case strings.EqualFold(id, "none"):
		if hasPath {
			return nil, fmt.Errorf("%s %q: none takes no PATH", what, s)
		}
		return &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE}, nil
	case hasPath && !path.IsAbs(mount):
		return nil, fmt.Errorf("%s %q: PATH %q is not absolute; want a guest path such as %s", what, s, mount, defaultMountPath)
	case hasPath && path.Clean(mount) != mount:
		return nil, fmt.Errorf("%s %q: PATH %q is not clean; write %s", what, s, mount, path.Clean(mount))
	}
	b := &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_BOUND, VolumeId: id, MountPath: mount}
	if strings.EqualFold(id, "new") {
		if !allowNew {
			return nil, fmt.Errorf("%s %q: NEW is only for `ws create`; bind an existing VOLUME_ID or none", what, s)
		}
		b.Mode, b.VolumeId = ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, ""
	}
	return b, nil
}

// isNone reports whether a binding binds no Volume; an absent one is NONE.
func isNone(b *ctrlv1.WorkspaceVolumeBinding) bool {
	return b == nil || b.GetMode() == ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NONE
}

// bindingCell shows a stored binding as the argument that makes it:
// VOLUME_ID:PATH, or "-" when the Workspace binds no Volume.
func bindingCell(b *ctrlv1.WorkspaceVolumeBinding) string {
	if isNone(b) {
		return "-"
	}
	return orDash(b.GetVolumeId()) + ":" + orDash(b.GetMountPath())
}

// optionalBool shows an optional field: true, false, or "-" when unset.
func optionalBool(b *bool) string {
	if b == nil {
		return "-"
	}
	return boolean(*b)
}

// showBinding prints a response: with -o json the whole message, else the
// Workspace's Volume binding as fields.
func showBinding(cmd *cobra.Command, c *conn, resp proto.Message, ws *ctrlv1.Workspace) error {
	if c.structured() {
		return c.writeMessage(cmd.OutOrStdout(), resp)
	}
	b := ws.GetSpec().GetVolume()
	return writeFields(cmd.OutOrStdout(), [][2]string{
		{"WORKSPACE", ws.GetWorkspaceId()},
		{"STATE", stateCell(ws)},
		{"MODE", enumName(b.GetMode(), "WORKSPACE_VOLUME_MODE_")},
		{"VOLUME", orDash(b.GetVolumeId())},
		{"MOUNT_PATH", orDash(b.GetMountPath())},
		{"DELETE_WITH_WORKSPACE", optionalBool(b.DeleteWithWorkspace)},
		{"BINDING_REVISION", decimal(ws.GetSpec().GetBindingRevision())},
		{"PERSISTENT_PATHS", orDash(strings.Join(ws.GetPersistentPaths(), ","))},
	})
}

func wsVolumeCommand(c *conn) *cobra.Command {
	var (
		deleteWith bool
		expected   uint64
	)
	cmd := &cobra.Command{
		Use:   "volume ID [VOLUME_ID[:PATH] | none] [--delete-with-workspace] [--expected-binding-revision N]",
		Short: "Show or replace the Volume binding of a Workspace",
		Long: "With ID alone, show the Volume binding of a Workspace. With a binding, replace it: the\n" +
			"Workspace must hold no execution (stop it first), and no other Workspace may bind the Volume.\n" +
			bindingHelp + "\n\n" +
			"Deleting the Workspace keeps the Volume unless --delete-with-workspace. The Volume the\n" +
			"change releases is always kept. Without --expected-binding-revision the command first\n" +
			"reads the current binding_revision (Get) and replaces that.",
		Args: cobra.RangeArgs(1, 2),
	}
	cmd.Flags().BoolVar(&deleteWith, "delete-with-workspace", false, "delete the Volume when the Workspace is deleted (default: keep it)")
	cmd.Flags().Uint64Var(&expected, "expected-binding-revision", 0, "binding_revision the change applies to (default: the current one, read first)")
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		id := args[0]
		var b *ctrlv1.WorkspaceVolumeBinding
		if len(args) == 2 {
			var err error
			if b, err = parseBinding("argument", args[1], false); err != nil {
				return err
			}
			if cmd.Flags().Changed("delete-with-workspace") {
				if isNone(b) {
					return errors.New("--delete-with-workspace needs a VOLUME_ID, not none")
				}
				b.DeleteWithWorkspace = proto.Bool(deleteWith)
			}
		} else {
			for _, f := range []string{"delete-with-workspace", "expected-binding-revision", "command-id"} {
				if cmd.Flags().Changed(f) {
					return fmt.Errorf("--%s needs a binding: VOLUME_ID[:PATH] or none", f)
				}
			}
		}
		cl, err := dial(cmd, c, ctrlv1connect.NewWorkspaceServiceClient)
		if err != nil {
			return err
		}
		if b == nil || !cmd.Flags().Changed("expected-binding-revision") {
			got, err := call(cmd.Context(), cl.GetWorkspace, &ctrlv1.GetWorkspaceRequest{WorkspaceId: id})
			if err != nil {
				return err
			}
			if b == nil {
				return showBinding(cmd, c, got, got.GetWorkspace())
			}
			expected = got.GetWorkspace().GetSpec().GetBindingRevision()
		}
		resp, err := call(cmd.Context(), cl.UpdateWorkspaceVolumeBinding, &ctrlv1.UpdateWorkspaceVolumeBindingRequest{
			Command: c.command(cmd, *commandID), WorkspaceId: id, ExpectedBindingRevision: expected, Volume: b,
		})
		if err != nil {
			return err
		}
		return showBinding(cmd, c, resp, resp.GetWorkspace())
	}
	return cmd
}
