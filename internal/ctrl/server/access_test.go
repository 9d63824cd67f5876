package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"connectrpc.com/grpcreflect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestPaginationWalk walks 2,500 selected egresses in pages while other
// rows are inserted: each selected one is seen exactly once.
func TestPaginationWalk(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		const total = 2500
		selected := map[string]bool{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		next := atomic.Int32{}
		for range 8 {
			wg.Go(func() {
				for i := int(next.Add(1)); i <= total+total/5; i = int(next.Add(1)) {
					labels := map[string]string{"walk": "yes", "n": fmt.Sprint(i)}
					if i > total {
						labels["walk"] = "no"
					}
					eg := e.createEgress(socks5("93.184.216.34:1080"), labels)
					if i <= total {
						mu.Lock()
						selected[eg.EgressId] = true
						mu.Unlock()
					}
				}
			})
		}
		wg.Wait()

		// Insert more rows, matching and not, while walking: a bounded
		// number, so that a walk slower than the inserts (the race
		// detector, a loaded machine) still reaches its end.
		stop := make(chan struct{})
		var inserted sync.WaitGroup
		inserted.Go(func() {
			for i := 0; i < total/5; i++ {
				select {
				case <-stop:
					return
				default:
				}
				e.createEgress(socks5("93.184.216.34:1080"), map[string]string{"walk": []string{"yes", "no"}[i%2]})
			}
		})
		seen := map[string]int{}
		token, pages := "", 0
		selector := map[string]string{"walk": "yes"}
		for {
			resp, err := e.egress.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{
				PageSize: 97, PageToken: token, LabelSelector: selector}))
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, eg := range resp.Msg.Egresses {
				if eg.Labels["walk"] != "yes" {
					t.Fatalf("selector returned %v", eg.Labels)
				}
				seen[eg.EgressId]++
			}
			if token = resp.Msg.NextPageToken; token == "" {
				break
			}
			if pages == 3 {
				// The token is bound to its selector and cannot be altered.
				_, err := e.egress.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{
					PageSize: 97, PageToken: token, LabelSelector: map[string]string{"walk": "no"}}))
				wantCode(t, "token with another selector", err, connect.CodeInvalidArgument)
				_, err = e.egress.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{PageSize: 97, PageToken: token}))
				wantCode(t, "token without its selector", err, connect.CodeInvalidArgument)
				tampered := []byte(token)
				tampered[len(tampered)/2] ^= 1
				_, err = e.egress.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{
					PageSize: 97, PageToken: string(tampered), LabelSelector: selector}))
				wantCode(t, "tampered token", err, connect.CodeInvalidArgument)
				_, err = e.resolver.ListResolvers(ctx, connect.NewRequest(&ctrlv1.ListResolversRequest{PageToken: token, LabelSelector: selector}))
				wantCode(t, "egress token on resolvers", err, connect.CodeInvalidArgument)
			}
		}
		close(stop)
		inserted.Wait()
		for id := range selected {
			if seen[id] != 1 {
				t.Errorf("egress %s seen %d times, want once", id, seen[id])
			}
		}
		for id, n := range seen {
			if n != 1 {
				t.Errorf("egress %s seen %d times", id, n)
			}
		}
		if pages < total/97 {
			t.Errorf("walk took %d pages, want at least %d", pages, total/97)
		}

		// Page size 0 selects the default of 100.
		resp, err := e.egress.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{LabelSelector: selector}))
		if err != nil || len(resp.Msg.Egresses) != 100 || resp.Msg.NextPageToken == "" {
			t.Errorf("default page: %d egresses, next %q, %v", len(resp.Msg.GetEgresses()), resp.Msg.GetNextPageToken(), err)
		}
	})
}

func TestAuthentication(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		mine := e.createEgress(socks5("93.184.216.34:1080"), map[string]string{"team": "a"})
		getMine := connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: mine.EgressId})

		for name, token := range map[string]string{
			"no token":       "",
			"garbage token":  "garbage",
			"unknown id":     "tok_00000000000000000000000000.secret",
			"wrong secret":   strings.SplitN(e.admin, ".", 2)[0] + ".wrong",
			"secret only":    strings.SplitN(e.admin, ".", 2)[1],
			"token id alone": strings.SplitN(e.admin, ".", 2)[0],
		} {
			eg, _, _ := e.clients(token)
			_, err := eg.GetEgress(ctx, getMine)
			wantCode(t, name, err, connect.CodeUnauthenticated)
			_, err = eg.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: cmd(), Spec: socks5("93.184.216.34:1080")}))
			wantCode(t, name+" (write)", err, connect.CodeUnauthenticated)
		}

		// A viewer reads but does not write.
		adminProject := e.adminProject()
		viewer, viewerResolvers, viewerAdmin := e.clients(e.token(adminProject, adminv1.Role_ROLE_VIEWER))
		if _, err := viewer.GetEgress(ctx, getMine); err != nil {
			t.Errorf("viewer get: %v", err)
		}
		if _, err := viewerResolvers.ListResolvers(ctx, connect.NewRequest(&ctrlv1.ListResolversRequest{})); err != nil {
			t.Errorf("viewer list: %v", err)
		}
		_, err := viewer.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: cmd(), Spec: socks5("93.184.216.34:1080")}))
		wantCode(t, "viewer create", err, connect.CodePermissionDenied)
		_, err = viewer.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Command: cmd(), EgressId: mine.EgressId}))
		wantCode(t, "viewer delete", err, connect.CodePermissionDenied)
		_, err = viewerAdmin.CreateToken(ctx, connect.NewRequest(&adminv1.CreateTokenRequest{Role: adminv1.Role_ROLE_ADMIN}))
		wantCode(t, "viewer creating a token", err, connect.CodePermissionDenied)
		if c, err := viewerAdmin.GetCaller(ctx, connect.NewRequest(&adminv1.GetCallerRequest{})); err != nil ||
			c.Msg.GetToken().GetRole() != adminv1.Role_ROLE_VIEWER || c.Msg.GetProject().GetProjectId() != adminProject {
			t.Errorf("a viewer's GetCaller: %v, %v", c, err)
		}

		// An editor writes but does not manage tokens or projects.
		editor, _, editorAdmin := e.clients(e.token(adminProject, adminv1.Role_ROLE_EDITOR))
		if _, err := editor.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: cmd(), Spec: socks5("93.184.216.34:1080")})); err != nil {
			t.Errorf("editor create: %v", err)
		}
		_, err = editorAdmin.CreateToken(ctx, connect.NewRequest(&adminv1.CreateTokenRequest{Role: adminv1.Role_ROLE_VIEWER}))
		wantCode(t, "editor creating a token", err, connect.CodePermissionDenied)
		if c, err := editorAdmin.GetCaller(ctx, connect.NewRequest(&adminv1.GetCallerRequest{})); err != nil || c.Msg.GetToken().GetRole() != adminv1.Role_ROLE_EDITOR {
			t.Errorf("an editor's GetCaller: %v, %v", c, err)
		}

		// Another project's admin cannot see this project's resources at all.
		otherProject, otherToken := e.project("tenant-b", adminv1.Role_ROLE_ADMIN)
		other, _, otherAdmin := e.clients(otherToken)
		_, err = other.GetEgress(ctx, getMine)
		wantCode(t, "other tenant get", err, connect.CodeNotFound)
		_, err = other.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Command: cmd(), EgressId: mine.EgressId, ExpectedRevision: 1, Spec: socks5("93.184.216.34:1080")}))
		wantCode(t, "other tenant update", err, connect.CodeNotFound)
		_, err = other.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{Command: cmd(), EgressId: mine.EgressId, ExpectedLabelsRevision: 1}))
		wantCode(t, "other tenant label", err, connect.CodeNotFound)
		_, err = other.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Command: cmd(), EgressId: mine.EgressId}))
		wantCode(t, "other tenant delete", err, connect.CodeNotFound)
		list, err := other.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{LabelSelector: map[string]string{"team": "a"}}))
		if err != nil || len(list.Msg.Egresses) != 0 {
			t.Errorf("other tenant list: %v, %v", list, err)
		}
		_, err = otherAdmin.CreateToken(ctx, connect.NewRequest(&adminv1.CreateTokenRequest{ProjectId: adminProject, Role: adminv1.Role_ROLE_ADMIN}))
		wantCode(t, "tenant admin minting a token in another project", err, connect.CodeNotFound)
		_, err = otherAdmin.CreateProject(ctx, connect.NewRequest(&adminv1.CreateProjectRequest{Name: "sneaky"}))
		wantCode(t, "tenant admin creating a project", err, connect.CodePermissionDenied)
		if c, err := otherAdmin.GetCaller(ctx, connect.NewRequest(&adminv1.GetCallerRequest{})); err != nil || c.Msg.GetToken().GetRole() != adminv1.Role_ROLE_ADMIN ||
			c.Msg.GetProject().GetProjectId() != otherProject || c.Msg.GetProject().GetName() != "tenant-b" || c.Msg.GetToken().GetProjectId() != otherProject {
			t.Errorf("a tenant admin's GetCaller: %v, %v", c, err)
		}
		projects, err := otherAdmin.ListProjects(ctx, connect.NewRequest(&adminv1.ListProjectsRequest{}))
		if err != nil || len(projects.Msg.Projects) != 1 || projects.Msg.Projects[0].ProjectId != otherProject {
			t.Errorf("tenant admin sees projects %v, %v", projects, err)
		}
		if got, err := e.egress.GetEgress(ctx, getMine); err != nil || !proto.Equal(got.Msg.Egress, mine) {
			t.Errorf("egress changed by another tenant: %v, %v", got, err)
		}

		// A revoked token stops working at once.
		tokens, err := otherAdmin.ListTokens(ctx, connect.NewRequest(&adminv1.ListTokensRequest{}))
		if err != nil || len(tokens.Msg.Tokens) != 1 {
			t.Fatalf("ListTokens: %v, %v", tokens, err)
		}
		if _, err := e.admins.RevokeToken(ctx, connect.NewRequest(&adminv1.RevokeTokenRequest{TokenId: tokens.Msg.Tokens[0].TokenId})); err != nil {
			t.Fatalf("operator revoking a tenant token: %v", err)
		}
		_, err = other.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
		wantCode(t, "revoked token", err, connect.CodeUnauthenticated)
		_, err = otherAdmin.GetCaller(ctx, connect.NewRequest(&adminv1.GetCallerRequest{}))
		wantCode(t, "revoked token's GetCaller", err, connect.CodeUnauthenticated)

		// The operator project always keeps an admin.
		mineTokens, err := e.admins.ListTokens(ctx, connect.NewRequest(&adminv1.ListTokensRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range mineTokens.Msg.Tokens {
			if tok.Role == adminv1.Role_ROLE_ADMIN {
				_, err := e.admins.RevokeToken(ctx, connect.NewRequest(&adminv1.RevokeTokenRequest{TokenId: tok.TokenId}))
				wantCode(t, "revoking the last operator admin", err, connect.CodeFailedPrecondition)
			}
		}
	})
}

// TestPasswordIsWriteOnly checks every response and the server log for
// the password.
func TestPasswordIsWriteOnly(t *testing.T) {
	var logs bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	defer slog.SetDefault(prev)

	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		const password = "s3cret-Pa55word-never-shown"
		var responses []proto.Message
		record := func(m proto.Message, err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			responses = append(responses, m)
		}
		create := &ctrlv1.CreateEgressRequest{Command: cmd(), Spec: withAuth("93.184.216.34:1080", "user", password)}
		created, err := e.egress.CreateEgress(ctx, connect.NewRequest(create))
		record(created.Msg, err)
		id := created.Msg.Egress.EgressId
		replay, err := e.egress.CreateEgress(ctx, connect.NewRequest(create))
		record(replay.Msg, err)
		got, err := e.egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: id}))
		record(got.Msg, err)
		list, err := e.egress.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
		record(list.Msg, err)
		updated, err := e.egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Command: cmd(), EgressId: id,
			ExpectedRevision: 1, Spec: withAuth("93.184.216.34:1081", "user", password)}))
		record(updated.Msg, err)
		labeled, err := e.egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{Command: cmd(), EgressId: id,
			ExpectedLabelsRevision: 1, Labels: map[string]string{"a": "b"}}))
		record(labeled.Msg, err)
		annotated, err := e.egress.UpdateEgressAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateEgressAnnotationsRequest{Command: cmd(), EgressId: id,
			ExpectedAnnotationsRevision: 1, Annotations: map[string]string{"a": "b"}}))
		record(annotated.Msg, err)
		// Refused requests must not echo it either.
		_, err = e.egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Command: cmd(), EgressId: id,
			ExpectedRevision: 1, Spec: withAuth("93.184.216.34:1081", "user", password)}))
		wantCode(t, "stale update", err, connect.CodeAborted)
		if strings.Contains(err.Error(), password) {
			t.Errorf("error message carries the password: %v", err)
		}
		_, err = e.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: cmd(), Spec: withAuth("10.0.0.1:1080", "user", password)}))
		wantCode(t, "private endpoint", err, connect.CodeInvalidArgument)
		if strings.Contains(err.Error(), password) {
			t.Errorf("error message carries the password: %v", err)
		}

		for _, m := range responses {
			j, _ := protojson.Marshal(m)
			b, _ := proto.Marshal(m)
			if bytes.Contains(j, []byte(password)) || bytes.Contains(b, []byte(password)) {
				t.Errorf("response carries the password: %s", j)
			}
		}
		if got.Msg.Egress.Spec.GetSocks5().Username != "user" || got.Msg.Egress.Spec.GetSocks5().Password != "" {
			t.Errorf("read returned %v, want the username and no password", got.Msg.Egress.Spec)
		}
		// The stored spec still holds it: the host needs it to dial.
		if updated.Msg.Egress.Revision != 2 {
			t.Errorf("update with the same password and a new address: revision %d, want 2", updated.Msg.Egress.Revision)
		}
	})
	if strings.Contains(logs.String(), "s3cret") {
		t.Errorf("the log carries the password:\n%s", logs.String())
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// TestProtocolsHealthAndReflection calls through gRPC over cleartext
// HTTP/2 and gRPC-Web, and checks the health and reflection endpoints.
func TestProtocolsHealthAndReflection(t *testing.T) {
	e := newEnv(t, testutil.SQLiteStore(t))
	ctx := context.Background()
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &protocols}}
	defer h2c.CloseIdleConnections()
	mine := e.createEgress(socks5("93.184.216.34:1080"), nil)
	for name, opt := range map[string]connect.ClientOption{"grpc": connect.WithGRPC(), "grpc-web": connect.WithGRPCWeb()} {
		client := ctrlv1connect.NewEgressServiceClient(h2c, e.url, opt, connect.WithInterceptors(bearer.Token(e.admin)))
		got, err := client.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: mine.EgressId}))
		if err != nil || got.Msg.Egress.EgressId != mine.EgressId {
			t.Errorf("%s GetEgress: %v, %v", name, got, err)
		}
		noAuth := ctrlv1connect.NewEgressServiceClient(h2c, e.url, opt)
		_, err = noAuth.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: mine.EgressId}))
		wantCode(t, name+" without a token", err, connect.CodeUnauthenticated)
	}

	// Health answers without a token (probes carry none).
	req, err := http.NewRequest(http.MethodPost, e.url+"/grpc.health.v1.Health/Check", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "SERVING") {
		t.Errorf("health: %d %s", resp.StatusCode, body)
	}

	stream := grpcreflect.NewClient(h2c, e.url, connect.WithGRPC()).NewStream(ctx)
	defer stream.Close()
	names, err := stream.ListServices()
	if err != nil {
		t.Fatal(err)
	}
	want := map[protoreflect.FullName]bool{ctrlv1connect.EgressServiceName: true, ctrlv1connect.ResolverServiceName: true}
	for _, n := range names {
		delete(want, n)
	}
	if len(want) != 0 {
		t.Errorf("reflection lists %v; missing %v", names, want)
	}
}
