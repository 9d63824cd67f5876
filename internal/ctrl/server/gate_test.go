package server_test

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestLargeRequestsOfBadTokensAreNotRead: a request of a caller whose
// token does not authenticate is refused before the server decodes it,
// which for a repeated field of empty messages (a policy of 3 million
// Egresses, in 6 MiB) would take hundreds of MB; on the control plane's
// services and the host API alike. A small one is refused as before.
func TestLargeRequestsOfBadTokensAreNotRead(t *testing.T) {
	logged := new(testutil.SyncBuffer) // the server's goroutines write it
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	e := newEnv(t, testutil.SQLiteStore(t))
	// UpdateWorkspaceNetworkPolicyRequest{policy: {egresses: 3M × {}}}
	policy := protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), bytes.Repeat([]byte{0x2a, 0}, 3<<20))
	reports := bytes.Repeat([]byte{0x12, 0}, 3<<20) // ReportExecutionsRequest{reports: 3M × {}}
	for _, c := range []struct {
		name, procedure, token string
		body                   []byte
	}{
		{"no token", ctrlv1connect.WorkspaceServiceUpdateWorkspaceNetworkPolicyProcedure, "", policy},
		{"a wrong token", ctrlv1connect.WorkspaceServiceUpdateWorkspaceNetworkPolicyProcedure, "Bearer tok_nope.nope", policy},
		{"a wrong host token", hostv1connect.HostServiceReportExecutionsProcedure, "Bearer nope", reports},
	} {
		body := c.body
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodPost, e.url+c.procedure, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/proto")
			if c.token != "" {
				req.Header.Set("Authorization", c.token)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			resp, err := e.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			runtime.ReadMemStats(&after)
			if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(answer), `"code":"unauthenticated"`) {
				t.Errorf("%d %s, want unauthenticated", resp.StatusCode, answer)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 32<<20 {
				t.Errorf("refusing it allocated %d MB", n>>20)
			}
			// Logged as the interceptors log the calls they refuse.
			if line := "msg=call method=" + c.procedure + " code=unauthenticated"; !strings.Contains(logged.String(), line) {
				t.Errorf("the log has no %q:\n%s", line, logged.String())
			}
		})
	}
	// A small request with a wrong token: refused by the interceptors, with
	// the reason attached.
	egress, _, _ := e.clients("tok_nope.nope")
	_, err := egress.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated || testutil.ErrorDetail(err).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_UNAUTHENTICATED {
		t.Errorf("a small request with a wrong token: %v", err)
	}
}
