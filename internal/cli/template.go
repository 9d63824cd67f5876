package cli

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

type templateClient = ctrlv1connect.TemplateServiceClient

func templateCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Manage Templates: named sets of immutable OCI image revisions that Workspaces are created from",
	}
	c := addConnFlags(cmd)
	cmd.AddCommand(
		templateCreateCommand(c),
		templateImportCommand(c),
		templateGetCommand(c),
		templates.listCommand(c),
		templateDefaultCommand(c),
		templateDeleteCommand(c),
		templates.mapCommand(c, templates.labels),
		templates.mapCommand(c, templates.annotations),
	)
	return cmd
}

// templateTable shows REVISIONS, how many the Template has, and REVISION,
// the CAS token `template default --expected-revision` takes.
var templateTable = table[*ctrlv1.Template]{
	header: []string{"ID", "DEFAULT", "REVISIONS", "REVISION", "LABELS", "AGE"},
	row: func(t *ctrlv1.Template) []string {
		return []string{
			t.GetTemplateId(),
			orDash(t.GetDefaultRevision()),
			strconv.Itoa(len(t.GetRevisions())),
			decimal(t.GetRevision()),
			pairs(t.GetLabels()),
			age(t.GetCreatedAt()),
		}
	},
}

// templateRevision is one revision of a Template and whether it is the
// default.
type templateRevision struct {
	rev       *ctrlv1.TemplateRevision
	isDefault bool
}

func revisionsOf(t *ctrlv1.Template) []templateRevision {
	out := make([]templateRevision, 0, len(t.GetRevisions()))
	for _, r := range t.GetRevisions() {
		out = append(out, templateRevision{r, r.GetRevision() == t.GetDefaultRevision()})
	}
	return out
}

var revisionTable = table[templateRevision]{
	header: []string{"REVISION", "DEFAULT", "SIZE", "UNPACKED", "SOURCE", "AGE"},
	row: func(r templateRevision) []string {
		return []string{
			r.rev.GetRevision(),
			boolean(r.isDefault),
			approxSize(r.rev.GetSizeBytes()),
			approxSize(r.rev.GetUnpackedBytes()),
			orDash(r.rev.GetSource()),
			age(r.rev.GetCreatedAt()),
		}
	},
}

func templateCreateCommand(c *conn) *cobra.Command {
	var meta metaFlags
	cmd := &cobra.Command{
		Use:   "create ID [--label k=v ...] [--annotation k=v ...]",
		Short: "Create an empty Template; then import a revision into it",
		Long: "Create an empty Template under ID: a DNS label of lower-case letters, digits and '-',\n" +
			"1 to 63 characters, starting with a letter. Workspaces can use it once `template import`\n" +
			"added a revision.",
		Args: cobra.ExactArgs(1),
	}
	meta.register(cmd)
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		labels, annotations, err := meta.parse()
		if err != nil {
			return err
		}
		resp, err := dialCall(cmd, c, ctrlv1connect.NewTemplateServiceClient, ctrlv1connect.TemplateServiceClient.CreateTemplate, &ctrlv1.CreateTemplateRequest{
			Command: c.command(cmd, *commandID), TemplateId: args[0], Labels: labels, Annotations: annotations,
		})
		if err != nil {
			return err
		}
		return show(cmd, c, resp, templateTable, resp.GetTemplate())
	}
	return cmd
}

func templateGetCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "get ID",
		Short: "Show one Template and its revisions",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := dial(cmd, c, ctrlv1connect.NewTemplateServiceClient)
			if err != nil {
				return err
			}
			resp, t, err := templates.get(cmd.Context(), cl, args[0])
			if err != nil {
				return err
			}
			if err := show(cmd, c, resp, templateTable, t); err != nil || c.structured() || len(t.GetRevisions()) == 0 {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return revisionTable.write(cmd.OutOrStdout(), revisionsOf(t), false)
		},
	}
}

func templateDefaultCommand(c *conn) *cobra.Command {
	var expected uint64
	cmd := &cobra.Command{
		Use:   "default ID REVISION [--expected-revision N]",
		Short: "Make a revision the Template's default, which new Workspaces get without @REVISION",
		Long: "Point the Template's default at one of its revisions. Existing Workspaces keep theirs.\n\n" +
			"Without --expected-revision the command first reads the Template's current revision (Get)\n" +
			"and changes that, so it overwrites any change made in between. When retrying with\n" +
			"--command-id, also pass --expected-revision.",
		Args: cobra.ExactArgs(2),
	}
	commandID := commandFlag(cmd)
	cmd.Flags().Uint64Var(&expected, "expected-revision", 0, "Template revision the change applies to (default: the current one, read first)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		cl, err := dial(cmd, c, ctrlv1connect.NewTemplateServiceClient)
		if err != nil {
			return err
		}
		id := args[0]
		rev, err := templates.casRevision(cmd, cl, id, "expected-revision", expected, templates.revision)
		if err != nil {
			return err
		}
		resp, err := call(cmd.Context(), cl.SetTemplateDefault, &ctrlv1.SetTemplateDefaultRequest{
			Command: c.command(cmd, *commandID), TemplateId: id, ExpectedRevision: rev, DefaultRevision: args[1],
		})
		if err != nil {
			return err
		}
		return show(cmd, c, resp, templateTable, resp.GetTemplate())
	}
	return cmd
}

func templateDeleteCommand(c *conn) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a Template and all its revisions; refused while a Workspace uses one",
		Args:  cobra.ExactArgs(1),
	}
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		resp, err := dialCall(cmd, c, ctrlv1connect.NewTemplateServiceClient, ctrlv1connect.TemplateServiceClient.DeleteTemplate, &ctrlv1.DeleteTemplateRequest{Command: c.command(cmd, *commandID), TemplateId: args[0]})
		if err != nil {
			return err
		}
		return confirm(cmd, c, resp, "deleted template %s", args[0])
	}
	return cmd
}

// templates builds list, label and annotate, and serves get and the CAS
// read of default. A Template has no spec, hence emptypb.Empty.
var templates = kind[templateClient, *emptypb.Empty, *ctrlv1.Template]{
	name:      "template",
	plural:    "templates",
	newClient: ctrlv1connect.NewTemplateServiceClient,
	table:     templateTable,
	revision:  (*ctrlv1.Template).GetRevision,

	get: func(ctx context.Context, cl templateClient, id string) (proto.Message, *ctrlv1.Template, error) {
		return carrying(ctx, cl.GetTemplate, &ctrlv1.GetTemplateRequest{TemplateId: id}, (*ctrlv1.GetTemplateResponse).GetTemplate)
	},
	list: func(ctx context.Context, cl templateClient, q listQuery) ([]*ctrlv1.Template, string, error) {
		return listed(ctx, cl.ListTemplates, &ctrlv1.ListTemplatesRequest{PageSize: q.pageSize, PageToken: q.pageToken, LabelSelector: q.selector}, (*ctrlv1.ListTemplatesResponse).GetTemplates)
	},
	listResponse: func(items []*ctrlv1.Template, next string) proto.Message {
		return &ctrlv1.ListTemplatesResponse{Templates: items, NextPageToken: next}
	},
	labels: labelField((*ctrlv1.Template).GetLabelsRevision, func(ctx context.Context, cl templateClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Template, error) {
		return carrying(ctx, cl.UpdateTemplateLabels, &ctrlv1.UpdateTemplateLabelsRequest{Command: cmd, TemplateId: id, ExpectedLabelsRevision: expected, Labels: m}, (*ctrlv1.UpdateTemplateLabelsResponse).GetTemplate)
	}),
	annotations: annotationField((*ctrlv1.Template).GetAnnotationsRevision, func(ctx context.Context, cl templateClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Template, error) {
		return carrying(ctx, cl.UpdateTemplateAnnotations, &ctrlv1.UpdateTemplateAnnotationsRequest{Command: cmd, TemplateId: id, ExpectedAnnotationsRevision: expected, Annotations: m}, (*ctrlv1.UpdateTemplateAnnotationsResponse).GetTemplate)
	}),
}
