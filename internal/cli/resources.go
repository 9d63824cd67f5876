package cli

import (
	"context"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

// wsResourceCommand builds `ws memory` and `ws disk`: one SIZE argument,
// CAS on resources_revision (read first when not given); when says in
// which states the change is accepted and when it applies.
func wsResourceCommand(c *conn, use, short, when string,
	update func(ctx context.Context, cl ctrlv1connect.WorkspaceServiceClient, meta *ctrlv1.CommandMetadata, id string, rev, size uint64) (proto.Message, *ctrlv1.Workspace, error)) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use + " ID SIZE [--expected-resources-revision N]",
		Short: short,
		Long: short + ". SIZE is like 512Mi or 2Gi (a whole number of MiB). " + when + "\n" +
			"Without --expected-resources-revision the current one is read first.",
		Args: cobra.ExactArgs(2),
	}
	rev := cmd.Flags().Uint64("expected-resources-revision", 0, "the resources_revision you observed")
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		size, err := parseSize("SIZE", args[1])
		if err != nil {
			return err
		}
		cl, err := dial(cmd, c, ctrlv1connect.NewWorkspaceServiceClient)
		if err != nil {
			return err
		}
		expected := *rev
		if expected == 0 {
			got, err := call(cmd.Context(), cl.GetWorkspace, &ctrlv1.GetWorkspaceRequest{WorkspaceId: args[0]})
			if err != nil {
				return err
			}
			expected = got.GetWorkspace().GetSpec().GetResourcesRevision()
		}
		resp, ws, err := update(cmd.Context(), cl, c.command(cmd, *commandID), args[0], expected, size)
		if err != nil {
			return err
		}
		return show(cmd, c, resp, workspaceTable, ws)
	}
	return cmd
}

func wsMemoryCommand(c *conn) *cobra.Command {
	return wsResourceCommand(c, "memory", "Change the memory of a Workspace",
		"A raise of an AVAILABLE\nWorkspace applies to it at once; any change of a STOPPED or FAILED one takes effect at its\nnext start.",
		func(ctx context.Context, cl ctrlv1connect.WorkspaceServiceClient, meta *ctrlv1.CommandMetadata, id string, rev, size uint64) (proto.Message, *ctrlv1.Workspace, error) {
			return carrying(ctx, cl.UpdateWorkspaceMemory, &ctrlv1.UpdateWorkspaceMemoryRequest{
				Command: meta, WorkspaceId: id, ExpectedResourcesRevision: rev, MemoryBytes: size}, (*ctrlv1.UpdateWorkspaceMemoryResponse).GetWorkspace)
		})
}

func wsDiskCommand(c *conn) *cobra.Command {
	return wsResourceCommand(c, "disk", "Grow the writable layer (disk) of a stopped Workspace",
		"The Workspace must be\nSTOPPED or FAILED; the change takes effect at its next start.",
		func(ctx context.Context, cl ctrlv1connect.WorkspaceServiceClient, meta *ctrlv1.CommandMetadata, id string, rev, size uint64) (proto.Message, *ctrlv1.Workspace, error) {
			return carrying(ctx, cl.ResizeWorkspaceWritableLayer, &ctrlv1.ResizeWorkspaceWritableLayerRequest{
				Command: meta, WorkspaceId: id, ExpectedResourcesRevision: rev, WritableLayerBytes: size}, (*ctrlv1.ResizeWorkspaceWritableLayerResponse).GetWorkspace)
		})
}
