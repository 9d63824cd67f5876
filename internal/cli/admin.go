package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
)

var projectTable = table[*adminv1.Project]{
	header: []string{"ID", "NAME", "OPERATOR", "CREATED"},
	row: func(p *adminv1.Project) []string {
		return []string{p.GetProjectId(), p.GetName(), boolean(p.GetOperator()), timestamp(p.GetCreatedAt())}
	},
}

var tokenTable = table[*adminv1.Token]{
	header: []string{"ID", "PROJECT", "ROLE", "NAME", "CREATED", "REVOKED"},
	row: func(t *adminv1.Token) []string {
		return []string{
			t.GetTokenId(),
			t.GetProjectId(),
			roleName(t.GetRole()),
			orDash(t.GetName()),
			timestamp(t.GetCreatedAt()),
			timestamp(t.GetRevokedAt()),
		}
	},
}

func projectCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "project", Short: "Manage projects (tenants); needs an admin token of the operator project"}
	c := addConnFlags(cmd)
	cmd.AddCommand(
		&cobra.Command{
			Use:   "create NAME",
			Short: "Create an empty project; then create its first admin token with `token create --project`",
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				cl, err := dial(cmd, c, adminv1connect.NewAdminServiceClient)
				if err != nil {
					return err
				}
				resp, err := call(cmd.Context(), cl.CreateProject, &adminv1.CreateProjectRequest{Name: args[0]})
				if err != nil {
					return err
				}
				return show(cmd, c, resp, projectTable, resp.GetProject())
			},
		},
		&cobra.Command{
			Use:   "list",
			Short: "List the projects the token can see",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				cl, err := dial(cmd, c, adminv1connect.NewAdminServiceClient)
				if err != nil {
					return err
				}
				resp, err := call(cmd.Context(), cl.ListProjects, &adminv1.ListProjectsRequest{})
				if err != nil {
					return err
				}
				return show(cmd, c, resp, projectTable, resp.GetProjects()...)
			},
		},
	)
	return cmd
}

func tokenCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Manage API tokens"}
	c := addConnFlags(cmd)
	cmd.AddCommand(tokenCreateCommand(c), tokenListCommand(c), tokenRevokeCommand(c))
	return cmd
}

func tokenCreateCommand(c *conn) *cobra.Command {
	var role, project, name string
	cmd := &cobra.Command{
		Use:   "create --role viewer|editor|admin [--project ID] [--name N]",
		Short: "Create an API token and print its secret, which is shown only this once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := parseRole(role)
			if err != nil {
				return err
			}
			cl, err := dial(cmd, c, adminv1connect.NewAdminServiceClient)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), cl.CreateToken, &adminv1.CreateTokenRequest{ProjectId: project, Role: r, Name: name})
			if err != nil {
				return err
			}
			if err := show(cmd, c, resp, tokenTable, resp.GetToken()); err != nil || c.output == outputJSON {
				return err
			}
			// The table goes first and the secret last, on a line of its own,
			// so that `| tail -n 1` captures it; the note is for the reader.
			fmt.Fprintln(cmd.ErrOrStderr(), "\nSecret, shown only this once (the server keeps only a hash):")
			_, err = fmt.Fprintln(cmd.OutOrStdout(), resp.GetSecret())
			return err
		},
	}
	cmd.Flags().StringVar(&role, "role", "", "viewer, editor or admin (required)")
	cmd.Flags().StringVar(&project, "project", "", "project the token acts in (default: the caller's)")
	cmd.Flags().StringVar(&name, "name", "", "who or what uses the token")
	_ = cmd.MarkFlagRequired("role")
	return cmd
}

func tokenListCommand(c *conn) *cobra.Command {
	var project string
	cmd := &cobra.Command{
		Use:   "list [--project ID]",
		Short: "List the tokens of a project, revoked ones included",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := dial(cmd, c, adminv1connect.NewAdminServiceClient)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), cl.ListTokens, &adminv1.ListTokensRequest{ProjectId: project})
			if err != nil {
				return err
			}
			return show(cmd, c, resp, tokenTable, resp.GetTokens()...)
		},
	}
	cmd.Flags().StringVar(&project, "project", "", "project whose tokens to list (default: the caller's)")
	return cmd
}

func tokenRevokeCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token at once",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := dial(cmd, c, adminv1connect.NewAdminServiceClient)
			if err != nil {
				return err
			}
			resp, err := call(cmd.Context(), cl.RevokeToken, &adminv1.RevokeTokenRequest{TokenId: args[0]})
			if err != nil {
				return err
			}
			return show(cmd, c, resp, tokenTable, resp.GetToken())
		},
	}
}

// parseRole accepts viewer, editor or admin, in any case.
func parseRole(s string) (adminv1.Role, error) {
	r, ok := adminv1.Role_value["ROLE_"+strings.ToUpper(s)]
	if !ok || r == int32(adminv1.Role_ROLE_UNSPECIFIED) {
		return 0, fmt.Errorf("--role %q: want viewer, editor or admin", s)
	}
	return adminv1.Role(r), nil
}

// roleName is the inverse of parseRole.
func roleName(r adminv1.Role) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}
