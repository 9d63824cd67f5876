package cli

// This file is `kibotos admin host` and `kibotos admin host-token`: the
// hosts of a fleet and what they authenticate with.

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
)

// hostTokenTable's HOSTS are the host IDs a token may register, or
// "(any)", which no host ID can be.
var hostTokenTable = table[*adminv1.HostToken]{
	header: []string{"ID", "NAME", "HOSTS", "CREATED", "REVOKED"},
	row: func(t *adminv1.HostToken) []string {
		hosts := strings.Join(t.GetHostIds(), ",")
		if t.GetAnyHost() {
			hosts = "(any)"
		}
		return []string{t.GetHostTokenId(), orDash(t.GetName()), hosts, timestamp(t.GetCreatedAt()), timestamp(t.GetRevokedAt())}
	},
}

var hostTable = table[*adminv1.Host]{
	header: []string{"HOST", "STATE", "DRAINED", "CPU", "MEMORY", "LAYERS", "WORKSPACES", "CAPABILITIES", "RUNTIMES", "ENDPOINT", "LAST REPORT"},
	row: func(h *adminv1.Host) []string {
		c, r := h.GetCapacity(), h.GetReserved()
		return []string{
			h.GetHostId(),
			strings.TrimPrefix(h.GetState().String(), "HOST_STATE_"),
			boolean(h.GetDrained()),
			fmt.Sprintf("%dm/%dm", r.GetCpuMillis(), c.GetCpuMillis()),
			usedOf(r.GetMemoryBytes(), c.GetMemoryBytes()),
			usedOf(r.GetLayerBytes(), c.GetLayerBytes()),
			fmt.Sprint(h.GetWorkspaces()),
			orDash(strings.Join(h.GetCapabilities(), ",")),
			orDash(strings.Join(h.GetRuntimes(), ",")),
			orDash(h.GetDataPlaneEndpoint()),
			timestamp(h.GetLastReportAt()),
		}
	},
}

// hostCommands are the admin groups host and host-token.
func hostCommands(c *conn) []*cobra.Command {
	host := &cobra.Command{Use: "host", Short: "The hosts that run workspaces: list, drain"}
	host.AddCommand(hostListCommand(c), hostDrainCommand(c, true), hostDrainCommand(c, false))
	token := &cobra.Command{Use: "host-token", Short: "The tokens host agents (kibotos host) authenticate with"}
	token.AddCommand(hostTokenCreateCommand(c), hostTokenListCommand(c), hostTokenRevokeCommand(c))
	return []*cobra.Command{host, token}
}

func hostListCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the registered hosts: state, capacity and what is reserved of it, capabilities, last report",
		Long: "List the registered hosts ordered by ID. CPU, MEMORY and LAYERS are reserved/capacity: the writable\n" +
			"layers of every workspace placed on the host, the CPU and memory of those that run. A LOST host\n" +
			"stopped reporting for the control plane's --host-lease; a drained one takes no new placements.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return adminShow(cmd, c, adminv1connect.AdminServiceClient.ListHosts, &adminv1.ListHostsRequest{}, hostTable, (*adminv1.ListHostsResponse).GetHosts)
		},
	}
}

func hostDrainCommand(c *conn, drain bool) *cobra.Command {
	use, short := "drain HOST", "Stop new placements on a host; its workspaces stay and start there again"
	if !drain {
		use, short = "undrain HOST", "Let a drained host take new placements again"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return adminShow(cmd, c, adminv1connect.AdminServiceClient.DrainHost, &adminv1.DrainHostRequest{HostId: args[0], Drained: drain}, hostTable, one((*adminv1.DrainHostResponse).GetHost))
		},
	}
}

func hostTokenCreateCommand(c *conn) *cobra.Command {
	var (
		name    string
		hosts   []string
		anyHost bool
	)
	cmd := &cobra.Command{
		Use:   "create (--host HOST... | --any-host) [--name N]",
		Short: "Create a host token and print its secret, which is shown only this once",
		Long: "Create a host token for the hosts (kibotos host --name) it may register, one --host each, and print\n" +
			"its secret, which is shown only this once. A registration of another host with it is refused, so a\n" +
			"stolen token cannot add hosts to the fleet. --any-host issues a token that may register any host.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := dialCall(cmd, c, adminv1connect.NewAdminServiceClient, adminv1connect.AdminServiceClient.CreateHostToken,
				&adminv1.CreateHostTokenRequest{Name: name, HostIds: hosts, AnyHost: anyHost})
			if err != nil {
				return err
			}
			return showSecret(cmd, c, resp, hostTokenTable, resp.GetHostToken(), resp.GetSecret(), "; give it to kibotos host --token-file")
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "which host or fleet uses the token")
	cmd.Flags().StringArrayVar(&hosts, "host", nil, "a host ID the token may register (repeatable)")
	cmd.Flags().BoolVar(&anyHost, "any-host", false, "let the token register a host of any ID")
	cmd.MarkFlagsOneRequired("host", "any-host")
	cmd.MarkFlagsMutuallyExclusive("host", "any-host")
	return cmd
}

func hostTokenListCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the host tokens, revoked ones included",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return adminShow(cmd, c, adminv1connect.AdminServiceClient.ListHostTokens, &adminv1.ListHostTokensRequest{}, hostTokenTable, (*adminv1.ListHostTokensResponse).GetHostTokens)
		},
	}
}

func hostTokenRevokeCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a host token at once: hosts using it are refused, stop reporting and become LOST",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return adminShow(cmd, c, adminv1connect.AdminServiceClient.RevokeHostToken, &adminv1.RevokeHostTokenRequest{HostTokenId: args[0]}, hostTokenTable, one((*adminv1.RevokeHostTokenResponse).GetHostToken))
		},
	}
}
