package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/internal/testutil/fakeresolver"
	"github.com/kibotos/kibotos/sdk/bearer"
	"github.com/kibotos/kibotos/sdk/failure"
)

// env is one control plane served over real HTTP on loopback.
type env struct {
	t        testing.TB
	store    store.Store
	url      string
	admin    string // bootstrap admin token of the operator project
	egress   ctrlv1connect.EgressServiceClient
	resolver ctrlv1connect.ResolverServiceClient
	admins   adminv1connect.AdminServiceClient
	http     *http.Client
}

// testHosts are the hostnames the tests' resolver knows; the tests never
// send a DNS query.
var testHosts = map[string][]netip.Addr{
	"proxy.example.com":    {netip.MustParseAddr("93.184.216.34")},
	"internal.example.com": {netip.MustParseAddr("10.1.2.3")},
	"mixed.example.com":    {netip.MustParseAddr("93.184.216.34"), netip.MustParseAddr("fd00::1")},
}

// backends runs fn once on SQLite and once on PostgreSQL.
func backends(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, newEnv(t, testutil.SQLiteStore(t))) })
	t.Run("postgres", func(t *testing.T) { fn(t, newEnv(t, testutil.PostgresStore(t))) })
}

func newEnv(t testing.TB, st store.Store) *env {
	t.Helper()
	ctl, secret := ctrltest.New(t, st, server.Config{Checker: &netcheck.Checker{Resolver: fakeresolver.New(testHosts)}})
	url, client := ctrltest.Serve(t, ctl.Handler)
	e := &env{t: t, store: st, url: url, admin: secret, http: client}
	e.egress, e.resolver, e.admins = e.clients(secret)
	return e
}

// clients returns Connect clients that send token.
func (e *env) clients(token string, opts ...connect.ClientOption) (ctrlv1connect.EgressServiceClient, ctrlv1connect.ResolverServiceClient, adminv1connect.AdminServiceClient) {
	if token != "" {
		opts = append(opts, connect.WithInterceptors(bearer.Token(token)))
	}
	return ctrlv1connect.NewEgressServiceClient(e.http, e.url, opts...),
		ctrlv1connect.NewResolverServiceClient(e.http, e.url, opts...),
		adminv1connect.NewAdminServiceClient(e.http, e.url, opts...)
}

// project creates a project and a token of role in it.
func (e *env) project(name string, role adminv1.Role) (projectID, token string) {
	e.t.Helper()
	p, err := e.admins.CreateProject(context.Background(), connect.NewRequest(&adminv1.CreateProjectRequest{Name: name}))
	if err != nil {
		e.t.Fatal(err)
	}
	return p.Msg.Project.ProjectId, e.token(p.Msg.Project.ProjectId, role)
}

// token creates a token of role in a project.
func (e *env) token(projectID string, role adminv1.Role) string {
	e.t.Helper()
	tok, err := e.admins.CreateToken(context.Background(), connect.NewRequest(&adminv1.CreateTokenRequest{ProjectId: projectID, Role: role, Name: "test"}))
	if err != nil {
		e.t.Fatal(err)
	}
	return tok.Msg.Secret
}

func cmd() *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: uuid.NewString()} }

func socks5(address string) *ctrlv1.EgressSpec {
	return &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: address}}}
}

func (e *env) createEgress(spec *ctrlv1.EgressSpec, labels map[string]string) *ctrlv1.Egress {
	e.t.Helper()
	resp, err := e.egress.CreateEgress(context.Background(), connect.NewRequest(&ctrlv1.CreateEgressRequest{
		Command: cmd(), Spec: spec, Labels: labels}))
	if err != nil {
		e.t.Fatalf("CreateEgress: %v", err)
	}
	return resp.Msg.Egress
}

func (e *env) createResolver(spec *ctrlv1.ResolverSpec) *ctrlv1.Resolver {
	e.t.Helper()
	resp, err := e.resolver.CreateResolver(context.Background(), connect.NewRequest(&ctrlv1.CreateResolverRequest{
		Command: cmd(), Spec: spec}))
	if err != nil {
		e.t.Fatalf("CreateResolver: %v", err)
	}
	return resp.Msg.Resolver
}

// countEgresses lists every live egress of the admin's project.
func (e *env) countEgresses() int {
	e.t.Helper()
	n, token := 0, ""
	for {
		resp, err := e.egress.ListEgresses(context.Background(), connect.NewRequest(&ctrlv1.ListEgressesRequest{PageSize: 1000, PageToken: token}))
		if err != nil {
			e.t.Fatal(err)
		}
		n += len(resp.Msg.Egresses)
		if token = resp.Msg.NextPageToken; token == "" {
			return n
		}
	}
}

// wantCode fails unless err is a Connect error with code.
func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: succeeded, want %v", what, code)
		return
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Errorf("%s: error %v is not a Connect error", what, err)
		return
	}
	if ce.Code() != code {
		t.Errorf("%s: code %v (%s), want %v", what, ce.Code(), ce.Message(), code)
	}
	// Every refusal names its reason, the one its code implies.
	if want := failure.ReasonOf(code); want != ctrlv1.FailureReason_FAILURE_REASON_UNSPECIFIED {
		if got := testutil.ErrorDetail(err).GetReason(); got != want {
			t.Errorf("%s: FailureReason %v, want %v", what, got, want)
		}
	}
}

func must[T any](t *testing.T, what string) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
}

func label(i int) map[string]string { return map[string]string{"n": fmt.Sprint(i)} }
