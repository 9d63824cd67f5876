package cli

import (
	"context"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
)

var projectTable = table[*adminv1.Project]{
	header: []string{"ID", "NAME", "OPERATOR", "AGE"},
	row: func(p *adminv1.Project) []string {
		return []string{p.GetProjectId(), p.GetName(), boolean(p.GetOperator()), age(p.GetCreatedAt())}
	},
}

var tokenTable = table[*adminv1.Token]{
	header: []string{"ID", "PROJECT", "ROLE", "NAME", "AGE", "REVOKED"},
	row: func(t *adminv1.Token) []string {
		return []string{
			t.GetTokenId(),
			t.GetProjectId(),
			roleName(t.GetRole()),
			orDash(t.GetName()),
			age(t.GetCreatedAt()),
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
				return adminShow(cmd, c, adminv1connect.AdminServiceClient.CreateProject, &adminv1.CreateProjectRequest{Name: args[0]}, projectTable, one((*adminv1.CreateProjectResponse).GetProject))
			},
		},
		&cobra.Command{
			Use:   "list",
			Short: "List the projects the token can see",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return adminShow(cmd, c, adminv1connect.AdminServiceClient.ListProjects, &adminv1.ListProjectsRequest{}, projectTable, (*adminv1.ListProjectsResponse).GetProjects)
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
			resp, err := dialCall(cmd, c, adminv1connect.NewAdminServiceClient, adminv1connect.AdminServiceClient.CreateToken, &adminv1.CreateTokenRequest{ProjectId: project, Role: r, Name: name})
			if err != nil {
				return err
			}
			return showSecret(cmd, c, resp, tokenTable, resp.GetToken(), resp.GetSecret(), "")
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
			return adminShow(cmd, c, adminv1connect.AdminServiceClient.ListTokens, &adminv1.ListTokensRequest{ProjectId: project}, tokenTable, (*adminv1.ListTokensResponse).GetTokens)
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
			return adminShow(cmd, c, adminv1connect.AdminServiceClient.RevokeToken, &adminv1.RevokeTokenRequest{TokenId: args[0]}, tokenTable, one((*adminv1.RevokeTokenResponse).GetToken))
		},
	}
}

// adminShow calls one AdminService method and shows its response: the
// rows pick takes from it in t, or with -o json|yaml the whole message.
func adminShow[Req, Resp any, PResp interface {
	*Resp
	proto.Message
}, T any](cmd *cobra.Command, c *conn, method func(adminv1connect.AdminServiceClient, context.Context, *connect.Request[Req]) (*connect.Response[Resp], error),
	req *Req, t table[T], pick func(PResp) []T) error {
	resp, err := dialCall(cmd, c, adminv1connect.NewAdminServiceClient, method, req)
	if err != nil {
		return err
	}
	return show(cmd, c, PResp(resp), t, pick(resp)...)
}

// one makes a getter of one row a pick of adminShow.
func one[R, T any](get func(R) T) func(R) []T {
	return func(r R) []T { return []T{get(r)} }
}

// showSecret shows a created credential in t and then its secret, which
// the server never shows again: last, on a line of its own, so that
// `| tail -n 1` captures it, after a note on stderr for the reader that
// ends with hint. With -o json|yaml the secret is in the message alone.
func showSecret[T any](cmd *cobra.Command, c *conn, resp proto.Message, t table[T], row T, secret, hint string) error {
	if err := show(cmd, c, resp, t, row); err != nil || c.structured() {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "\nSecret, shown only this once (the server keeps only a hash)%s:\n", hint)
	_, err := fmt.Fprintln(cmd.OutOrStdout(), secret)
	return err
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

var poolTable = table[*adminv1.StoragePool]{
	header: []string{"NAME", "DEFAULT", "PROFILE", "HOSTS"},
	row: func(p *adminv1.StoragePool) []string {
		return []string{
			p.GetName(),
			boolean(p.GetDefault()),
			formatSize(p.GetDefaultVolumeBytes()),
			orDash(strings.Join(p.GetHostIds(), ",")),
		}
	},
}

func adminCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "admin", Short: "Operate the deployment; needs an admin token of the operator project"}
	c := addConnFlags(cmd)
	pool := &cobra.Command{Use: "pool", Short: "Storage pools: the places Volumes live in"}
	pool.AddCommand(poolListCommand(c), poolLostCommand(c))
	cmd.AddCommand(pool)
	cmd.AddCommand(hostCommands(c)...)
	return cmd
}

func poolListCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the storage pools registered hosts reach, with their profile capacity",
		Long: "List the storage pools registered hosts reach, ordered by name. PROFILE is the capacity of a\n" +
			"Volume created in the pool without a size; DEFAULT marks the pool a Volume gets without --pool.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return adminShow(cmd, c, adminv1connect.AdminServiceClient.ListStoragePools, &adminv1.ListStoragePoolsRequest{}, poolTable, (*adminv1.ListStoragePoolsResponse).GetStoragePools)
		},
	}
}

func poolLostCommand(c *conn) *cobra.Command {
	var host string
	cmd := &cobra.Command{
		Use:   "lost NAME [--host HOST]",
		Short: "Declare a host's storage pool and every Volume in it gone for good; print the Volumes made LOST",
		Long: "Declare the storage pool NAME of one host lost, with its data, in every project. Each host has\n" +
			"pools of its own, and several may give theirs one name (each has \"default\"): only the Volumes\n" +
			"held by HOST in its pool NAME are concerned. --host is required when the pool has more than\n" +
			"one host: one that reaches it (admin pool list shows them), holds Volumes of it, or lost\n" +
			"Volumes of it that are still LOST. Those Volumes that are not DELETED become LOST: they stay\n" +
			"readable and deletable, every other call on them is refused, and a Workspace bound to one\n" +
			"fails to start with VOLUME_LOST until it binds another Volume or is deleted. Hosts no longer\n" +
			"create, grow or mount them. There is no way back and no confirmation is asked. Declaring a\n" +
			"pool lost again is harmless.\n\n" +
			"The IDs of the Volumes this call made LOST go to stdout, one a line, and a summary to stderr.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := dialCall(cmd, c, adminv1connect.NewAdminServiceClient, adminv1connect.AdminServiceClient.DeclareStoragePoolLost,
				&adminv1.DeclareStoragePoolLostRequest{StoragePool: args[0], HostId: host})
			if err != nil {
				return err
			}
			if c.structured() {
				return c.writeMessage(cmd.OutOrStdout(), resp)
			}
			ids := resp.GetLostVolumeIds()
			where := args[0]
			if h := resp.GetHostId(); h != "" {
				where += " on host " + h
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "storage pool %s declared lost; %d Volume(s) became LOST\n", where, len(ids))
			for _, id := range ids {
				if _, err := fmt.Fprintln(cmd.OutOrStdout(), id); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&host, "host", "", "the host whose pool is gone (required when several hosts have a pool NAME)")
	return cmd
}
