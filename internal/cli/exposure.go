package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

var exposureTable = table[*ctrlv1.Exposure]{
	header: []string{"ID", "WORKSPACE", "PORT", "AUTH", "PERSISTENT", "URL", "AGE"},
	row: func(x *ctrlv1.Exposure) []string {
		return []string{x.GetExposureId(), x.GetWorkspaceId(), decimal(uint64(x.GetPort())),
			enumName(x.GetAuth(), "EXPOSURE_AUTH_"), fmt.Sprint(x.GetPersistent()), x.GetUrl(), age(x.GetCreatedAt())}
	},
}

func wsExposeCommand(c *conn) *cobra.Command {
	var public, persistent bool
	cmd := &cobra.Command{
		Use:   "expose WS PORT [--public] [--persistent]",
		Short: "Give a guest port a URL that reaches it over HTTP and WebSocket; prints the URL and its token",
		Long: "Give a TCP port of an AVAILABLE Workspace's guest a URL that reaches it over HTTP/1.1, HTTP/2\n" +
			"and WebSocket. Without --public a request needs the exposure's token, printed once: as\n" +
			"Authorization: Bearer TOKEN, or opened once as URL?kibotos_token=TOKEN in a browser, which\n" +
			"then keeps a cookie. The exposure ends when the Workspace stops, unless --persistent.",
		Args: cobra.ExactArgs(2),
	}
	commandID := commandFlag(cmd)
	cmd.Flags().BoolVar(&public, "public", false, "anyone with the URL reaches the port (EXPOSURE_AUTH_PUBLIC)")
	cmd.Flags().BoolVar(&persistent, "persistent", false, "keep the exposure across stops: it comes back at the next start")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// The server judges the range (1 to 65535).
		port, err := strconv.ParseUint(args[1], 10, 32)
		if err != nil {
			return fmt.Errorf("port %q is not a number", args[1])
		}
		auth := ctrlv1.ExposureAuth_EXPOSURE_AUTH_TOKEN
		if public {
			auth = ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC
		}
		resp, err := dialCall(cmd, c, ctrlv1connect.NewExposureServiceClient, ctrlv1connect.ExposureServiceClient.CreateExposure,
			&ctrlv1.CreateExposureRequest{Command: c.command(cmd, *commandID), WorkspaceId: args[0], Port: uint32(port),
				Auth: auth, Persistent: persistent})
		if err != nil {
			return err
		}
		x := resp.GetExposure()
		if err := show(cmd, c, resp, exposureTable, x); err != nil || c.structured() || x.GetToken() == "" {
			return err
		}
		// The token last, on a line of its own, so that `| tail -n 1`
		// captures it; the notes are for the reader.
		fmt.Fprintf(cmd.ErrOrStderr(), "\nIn a browser, open once: %s?kibotos_token=%s\nToken, shown only this once (the server keeps only a hash):\n",
			x.GetUrl(), x.GetToken())
		_, err = fmt.Fprintln(cmd.OutOrStdout(), x.GetToken())
		return err
	}
	return cmd
}

func wsExposuresCommand(c *conn) *cobra.Command {
	return &cobra.Command{
		Use:   "exposures WS",
		Short: "List the live exposures of a Workspace",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := dial(cmd, c, ctrlv1connect.NewExposureServiceClient)
			if err != nil {
				return err
			}
			all := &ctrlv1.ListExposuresResponse{}
			for token := ""; ; {
				resp, err := call(cmd.Context(), cl.ListExposures, &ctrlv1.ListExposuresRequest{WorkspaceId: args[0], PageToken: token})
				if err != nil {
					return err
				}
				all.Exposures = append(all.Exposures, resp.GetExposures()...)
				if token = resp.GetNextPageToken(); token == "" {
					break
				}
			}
			return show(cmd, c, all, exposureTable, all.Exposures...)
		},
	}
}

func exposureCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "exposure", Short: "Manage exposures of guest ports (create them with `ws expose`)"}
	c := addConnFlags(cmd)
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an exposure: within a second its URL no longer reaches the guest",
		Args:  cobra.ExactArgs(1),
	}
	commandID := commandFlag(revoke)
	revoke.RunE = func(cmd *cobra.Command, args []string) error {
		resp, err := dialCall(cmd, c, ctrlv1connect.NewExposureServiceClient, ctrlv1connect.ExposureServiceClient.RevokeExposure,
			&ctrlv1.RevokeExposureRequest{Command: c.command(cmd, *commandID), ExposureId: args[0]})
		if err != nil {
			return err
		}
		return confirm(cmd, c, resp, "revoked exposure %s", args[0])
	}
	cmd.AddCommand(revoke)
	return cmd
}
