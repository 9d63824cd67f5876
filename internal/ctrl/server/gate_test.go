package server_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
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
			status, answer, allocated := sendMeasured(t, e, c.procedure, body, func(h http.Header) {
				h.Set("Content-Type", "application/proto")
				if c.token != "" {
					h.Set("Authorization", c.token)
				}
			})
			if status != http.StatusUnauthorized || !strings.Contains(answer, `"code":"unauthenticated"`) {
				t.Errorf("%d %s, want unauthenticated", status, answer)
			}
			if allocated > 32<<20 {
				t.Errorf("refusing it allocated %d MB", allocated>>20)
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

// TestRequestsThatDecodeLargeAreNotDecoded: a token that authenticates
// cannot make the control plane decode a request into hundreds of MB
// either. A role that may not call the method is refused before the
// request is read, and a request of more elements than any the reference
// admits (a repeated field of empty messages, in binary or JSON) is
// refused before it is decoded.
func TestRequestsThatDecodeLargeAreNotDecoded(t *testing.T) {
	e := newEnv(t, testutil.SQLiteStore(t))
	project := e.adminProject()
	viewer := "Bearer " + e.token(project, adminv1.Role_ROLE_VIEWER)
	editor := "Bearer " + e.token(project, adminv1.Role_ROLE_EDITOR)
	// UpdateWorkspaceNetworkPolicyRequest{policy: {egresses: 3M × {}}}
	policy := protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), bytes.Repeat([]byte{0x2a, 0}, 3<<20))
	policyJSON := []byte(`{"workspaceId":"ws_x","policy":{"egresses":[{}` + strings.Repeat(`,{}`, 2<<20) + `]}}`)
	var gzipped bytes.Buffer // 6 MiB of JSON in a few KiB, which a caller without a token may send
	zw := gzip.NewWriter(&gzipped)
	zw.Write(policyJSON)
	zw.Close()
	for _, c := range []struct {
		name, token, contentType string
		body                     []byte
		code                     connect.Code
		says                     string
	}{
		{"a viewer's", viewer, "application/proto", policy, connect.CodePermissionDenied, "may not call"},
		{"an editor's", editor, "application/proto", policy, connect.CodeInvalidArgument, "more than 262144 elements"},
		{"an editor's in JSON", editor, "Application/JSON", policyJSON, connect.CodeInvalidArgument, "more than 262144 elements"},
		{"a gzipped one in JSON, of no token", "", "application/json", gzipped.Bytes(), connect.CodeInvalidArgument, "more than 262144 elements"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, answer, allocated := sendMeasured(t, e, ctrlv1connect.WorkspaceServiceUpdateWorkspaceNetworkPolicyProcedure, c.body, func(h http.Header) {
				h.Set("Content-Type", c.contentType)
				if c.token != "" {
					h.Set("Authorization", c.token)
				}
				if c.body[0] == 0x1f { // gzip's magic
					h.Set("Content-Encoding", "gzip")
				}
			})
			if code := `"code":"` + c.code.String() + `"`; !strings.Contains(answer, code) || !strings.Contains(answer, c.says) {
				t.Errorf("%d %s, want %s saying %q", status, answer, code, c.says)
			}
			if allocated > 64<<20 {
				t.Errorf("refusing it allocated %d MB", allocated>>20)
			}
		})
	}
}

// sendMeasured posts body to procedure with the header header sets, and
// returns the answer's status and body and what this process (the
// server) allocated meanwhile.
func sendMeasured(t *testing.T, e *env, procedure string, body []byte, header func(http.Header)) (status int, answer string, allocated uint64) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+procedure, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	header(req.Header)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	runtime.ReadMemStats(&after)
	return resp.StatusCode, string(b), after.TotalAlloc - before.TotalAlloc
}
