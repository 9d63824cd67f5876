package cli

import (
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

func wsDescribeCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "describe ID",
		Short: "Show everything about one Workspace, with what its host observes, in one screen",
		Long: "Show the Workspace's state, spec, labels, annotations, expiration, failure and last stop,\n" +
			"the observations of its template delivery and its guest, then its network policy, status and\n" +
			"faults as `ws network get` does. -o json or -o yaml prints the whole GetWorkspaceResponse.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := dialCall(cmd, c, ctrlv1connect.NewWorkspaceServiceClient, ctrlv1connect.WorkspaceServiceClient.GetWorkspace, &ctrlv1.GetWorkspaceRequest{WorkspaceId: args[0]})
			if err != nil {
				return err
			}
			if c.structured() {
				return c.writeMessage(cmd.OutOrStdout(), resp)
			}
			return describeWorkspace(cmd.OutOrStdout(), resp.GetWorkspace())
		},
	}
}

// describeWorkspace prints a Workspace as fields, then its network.
func describeWorkspace(w io.Writer, ws *ctrlv1.Workspace) error {
	s, r := ws.GetSpec(), ws.GetSpec().GetResources()
	fields := [][2]string{
		{"ID", ws.GetWorkspaceId()},
		{"STATE", stateCell(ws)},
		{"GENERATION", decimal(ws.GetGeneration())},
		{"TEMPLATE", templateRef(s.GetTemplate())},
		{"RESOURCES", "cpu " + cpuCell(r.GetCpuMillis()) + ", memory " + formatSize(r.GetMemoryBytes()) + ", disk " + diskCell(ws)},
		{"VOLUME", bindingCell(s.GetVolume())},
		{"LABELS", pairs(ws.GetLabels())},
		{"ANNOTATIONS", annotationCell(ws.GetAnnotations())},
		{"CREATED", when(ws.GetCreatedAt())},
		{"UPDATED", when(ws.GetUpdatedAt())},
		{"EXPIRES", "-"},
	}
	if exp := ws.GetExpiration().GetPolicy(); exp != nil {
		fields[len(fields)-1][1] = timestamp(exp.GetDeadline()) + " (" + enumName(exp.GetAction(), "WORKSPACE_EXPIRATION_ACTION_") + ")"
	}
	if f := ws.GetFailure(); f != nil {
		fields = append(fields, [2]string{"FAILURE", strings.Join([]string{
			enumName(f.GetReason(), "FAILURE_REASON_"), enumName(f.GetStage(), "FAILURE_STAGE_"), orDash(f.GetMessage()), when(f.GetFailedAt()),
		}, " / ")})
	}
	if st := ws.GetLastStop(); st != nil {
		fields = append(fields, [2]string{"LAST STOP", enumName(st.GetCause(), "STOP_CAUSE_") + ", " + enumName(st.GetMode(), "STOP_MODE_") +
			", durability " + enumName(st.GetDurability(), "STOP_DURABILITY_") + ", completed " + when(st.GetCompletedAt())})
	}
	if d := ws.GetDelivery(); d != nil {
		fields = append(fields, [2]string{"DELIVERY", enumName(d.GetState(), "TEMPLATE_DELIVERY_STATE_") + ", " +
			approxSize(d.GetBytesDelivered()) + " of " + approxSize(d.GetBytesTotal()) + ", observed " + when(d.GetObservedAt())})
	}
	if g := ws.GetGuestObservation(); g != nil {
		guest := enumName(g.GetCondition(), "GUEST_CONDITION_") + ", memory " + enumName(g.GetMemoryCondition(), "GUEST_MEMORY_CONDITION_") +
			", " + decimal(uint64(g.GetRestartCount())) + " restarts, " + decimal(uint64(g.GetMemoryKillCount())) + " memory kills, observed " + when(g.GetObservedAt())
		if g.GetError() != "" {
			guest += ": " + g.GetError()
		}
		fields = append(fields, [2]string{"GUEST", guest})
	}
	if err := writeFields(w, fields); err != nil {
		return err
	}
	if _, err := io.WriteString(w, "\nNETWORK\n"); err != nil {
		return err
	}
	return writeNetwork(w, ws)
}

// when is a time and its age: 2026-01-10T12:00:00Z (5m ago); "-" when
// absent.
func when(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return timestamp(ts) + " (" + age(ts) + " ago)"
}
