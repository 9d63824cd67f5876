package daemon_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestServiceSessions reaches a guest port through the gateway with
// session tokens: the workspace's own token connects; another
// workspace's token reaches only that workspace (whose guest has nothing
// on the port); a token rewritten to name this workspace, and a token of
// the control plane, are refused before any guest.
func TestServiceSessions(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	a := d.sdkWorkspace(128<<20, 64<<20)
	b := d.sdkWorkspace(128<<20, 64<<20)
	if _, err := a.Start(ctx, []string{"nc", "-l", "-p", "7000", "-e", "echo", "from a"}, sdk.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	admin, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	sessions := ctrlv1connectSessions(d, strings.TrimSpace(string(admin)))
	issue := func(id string) *ctrlv1.IssueSessionResponse {
		resp, err := sessions.IssueSession(ctx, connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}
	// connectPort opens ConnectService to port 7000 with token and returns
	// what the guest sent, or the call's error.
	connectPort := func(endpoint, token string) (string, error) {
		services := datav1connect.NewServiceServiceClient(httpClient(), endpoint, connect.WithInterceptors(bearer.Token(token)))
		stream := services.ConnectService(ctx)
		defer stream.CloseResponse()
		stream.Send(&datav1.ConnectServiceRequest{Port: 7000})
		stream.CloseRequest()
		var got []byte
		for {
			msg, err := stream.Receive()
			if errors.Is(err, io.EOF) {
				return string(got), nil
			}
			if err != nil {
				return string(got), err
			}
			got = append(got, msg.GetData()...)
		}
	}
	stage := func(err error) ctrlv1.FailureStage {
		detail, _ := sdk.FailureOf(err)
		return detail.GetStage()
	}

	sb := issue(b.ID())
	if _, err := connectPort(sb.Endpoint, sb.Token); connect.CodeOf(err) != connect.CodeUnavailable || stage(err) != ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE {
		t.Errorf("b's token, b has nothing on the port: %v", err)
	}
	forged := strings.Replace(sb.Token, b.ID(), a.ID(), 1)
	if _, err := connectPort(sb.Endpoint, forged); connect.CodeOf(err) != connect.CodeUnauthenticated || stage(err) != ctrlv1.FailureStage_FAILURE_STAGE_AUTHORIZING_DATA_PLANE {
		t.Errorf("b's token rewritten to name a: %v", err)
	}
	if _, err := connectPort(sb.Endpoint, strings.TrimSpace(string(admin))); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("the admin API token: %v", err)
	}
	sa := issue(a.ID())
	// nc may not listen yet: a refusal is retried.
	eventually(t, 30*time.Second, "a's service to answer", func() (string, error) {
		got, err := connectPort(sa.Endpoint, sa.Token)
		if connect.CodeOf(err) == connect.CodeUnavailable && stage(err) == ctrlv1.FailureStage_FAILURE_STAGE_CONNECTING_SERVICE {
			return "", nil
		}
		return got, err
	}, func(got string) bool { return got == "from a\n" })
}
