package server_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestNULInAnyStringIsInvalid: a request whose ID, name, command ID or
// nested string holds U+0000 is invalid_argument on both stores, before
// anything is read or written; PostgreSQL failed such calls as internal,
// and SQLite stored the names.
func TestNULInAnyStringIsInvalid(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		workspaces := ctrlv1connect.NewWorkspaceServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(e.admin)))
		calls := map[string]func() error{
			"a token's name": func() error {
				_, err := e.admins.CreateToken(ctx, connect.NewRequest(&adminv1.CreateTokenRequest{Role: adminv1.Role_ROLE_VIEWER, Name: "x\x00y"}))
				return err
			},
			"a command ID": func() error {
				_, err := e.egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{
					Command: &ctrlv1.CommandMetadata{CommandId: "a\x00b"}, EgressId: "eg_x"}))
				return err
			},
			"an ID": func() error {
				_, err := workspaces.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: "ws_\x00"}))
				return err
			},
			"a label in a map": func() error {
				_, err := workspaces.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{LabelSelector: map[string]string{"a": "b\x00"}}))
				return err
			},
			"an ID in a stream's request": func() error {
				stream, err := workspaces.WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: "ws_\x00"}))
				if err != nil {
					return err
				}
				defer stream.Close()
				for stream.Receive() {
				}
				return stream.Err()
			},
		}
		for name, call := range calls {
			if err := call(); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "U+0000") {
				t.Errorf("%s holding U+0000: %v, want invalid_argument", name, err)
			}
		}
		tokens, err := e.admins.ListTokens(ctx, connect.NewRequest(&adminv1.ListTokensRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range tokens.Msg.GetTokens() {
			if strings.Contains(tok.GetName(), "\x00") {
				t.Errorf("a refused token was stored: %q", tok.GetName())
			}
		}
	})
}
