package server_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestHostTokens: only an operator admin issues, lists and revokes host
// tokens and lists and drains hosts; a host token authenticates on the
// host API and nowhere else, an API token never there; a revoked one is
// refused at once.
func TestHostTokens(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		hostAPI := func(token string) hostv1connect.HostServiceClient {
			return hostv1connect.NewHostServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(token)))
		}
		register := func(token string) error {
			_, err := hostAPI(token).RegisterHost(ctx, connect.NewRequest(&hostv1.RegisterHostRequest{HostId: "h1",
				Capacity: &hostv1.HostCapacity{CpuMillis: 1000, MemoryBytes: 1 << 30, LayerBytes: 1 << 30}}))
			return err
		}

		_, tenant := e.project("tenant-b", adminv1.Role_ROLE_ADMIN)
		_, _, tenantAdmin := e.clients(tenant)
		_, err := tenantAdmin.CreateHostToken(ctx, connect.NewRequest(&adminv1.CreateHostTokenRequest{Name: "x"}))
		wantCode(t, "tenant admin issuing a host token", err, connect.CodePermissionDenied)
		_, err = tenantAdmin.ListHosts(ctx, connect.NewRequest(&adminv1.ListHostsRequest{}))
		wantCode(t, "tenant admin listing hosts", err, connect.CodePermissionDenied)
		_, err = tenantAdmin.DrainHost(ctx, connect.NewRequest(&adminv1.DrainHostRequest{HostId: "h1", Drained: true}))
		wantCode(t, "tenant admin draining a host", err, connect.CodePermissionDenied)
		for what, req := range map[string]*adminv1.CreateHostTokenRequest{
			"a host token name too long":               {Name: strings.Repeat("n", 129), AnyHost: true},
			"a host token of no hosts":                 {Name: "x"},
			"a host token of named hosts and any host": {HostIds: []string{"h1"}, AnyHost: true},
			"a host token of a malformed host ID":      {HostIds: []string{"h1", "H_2"}},
			"a host token of 257 host IDs":             {HostIds: slices.Repeat([]string{"h1"}, 257)},
		} {
			_, err = e.admins.CreateHostToken(ctx, connect.NewRequest(req))
			wantCode(t, what, err, connect.CodeInvalidArgument)
		}
		if list, err := e.admins.ListHostTokens(ctx, connect.NewRequest(&adminv1.ListHostTokensRequest{})); err != nil {
			t.Fatal(err)
		} else if len(list.Msg.HostTokens) != 0 {
			t.Fatalf("%d host tokens after refused creates, want none", len(list.Msg.HostTokens))
		}

		created, err := e.admins.CreateHostToken(ctx, connect.NewRequest(&adminv1.CreateHostTokenRequest{Name: "rack 1", HostIds: []string{"h2", "h1", "h2"}}))
		if err != nil {
			t.Fatal(err)
		}
		if got := created.Msg.HostToken; !slices.Equal(got.GetHostIds(), []string{"h1", "h2"}) || got.GetAnyHost() {
			t.Errorf("created host token = %v, want host_ids h1, h2", got)
		}
		secret, id := created.Msg.Secret, created.Msg.HostToken.GetHostTokenId()
		if err := register(secret); err != nil {
			t.Fatalf("RegisterHost with a host token: %v", err)
		}
		wantCode(t, "RegisterHost with an API token", register(e.admin), connect.CodeUnauthenticated)
		wantCode(t, "RegisterHost with a tampered host token", register(secret+"x"), connect.CodeUnauthenticated)
		_, _, asHost := e.clients(secret)
		_, err = asHost.ListHosts(ctx, connect.NewRequest(&adminv1.ListHostsRequest{}))
		wantCode(t, "the admin API with a host token", err, connect.CodeUnauthenticated)

		hosts, err := e.admins.ListHosts(ctx, connect.NewRequest(&adminv1.ListHostsRequest{}))
		if err != nil || len(hosts.Msg.Hosts) != 1 || hosts.Msg.Hosts[0].HostId != "h1" || hosts.Msg.Hosts[0].State != adminv1.HostState_HOST_STATE_READY ||
			hosts.Msg.Hosts[0].Capacity.GetCpuMillis() != 1000 {
			t.Fatalf("ListHosts: %v, %v", hosts, err)
		}
		drained, err := e.admins.DrainHost(ctx, connect.NewRequest(&adminv1.DrainHostRequest{HostId: "h1", Drained: true}))
		if err != nil || !drained.Msg.Host.GetDrained() {
			t.Errorf("DrainHost: %v, %v", drained, err)
		}
		_, err = e.admins.DrainHost(ctx, connect.NewRequest(&adminv1.DrainHostRequest{HostId: "nope", Drained: true}))
		wantCode(t, "draining an unknown host", err, connect.CodeNotFound)

		revoked, err := e.admins.RevokeHostToken(ctx, connect.NewRequest(&adminv1.RevokeHostTokenRequest{HostTokenId: id}))
		if err != nil || revoked.Msg.HostToken.GetRevokedAt() == nil {
			t.Fatalf("RevokeHostToken: %v, %v", revoked, err)
		}
		wantCode(t, "RegisterHost with a revoked host token", register(secret), connect.CodeUnauthenticated)
		again, err := e.admins.RevokeHostToken(ctx, connect.NewRequest(&adminv1.RevokeHostTokenRequest{HostTokenId: id}))
		if err != nil || !again.Msg.HostToken.GetRevokedAt().AsTime().Equal(revoked.Msg.HostToken.GetRevokedAt().AsTime()) {
			t.Errorf("revoking again: %v, %v; want it unchanged", again, err)
		}
		_, err = e.admins.RevokeHostToken(ctx, connect.NewRequest(&adminv1.RevokeHostTokenRequest{HostTokenId: "htk_nope"}))
		wantCode(t, "revoking an unknown host token", err, connect.CodeNotFound)
		list, err := e.admins.ListHostTokens(ctx, connect.NewRequest(&adminv1.ListHostTokensRequest{}))
		if err != nil || len(list.Msg.HostTokens) != 1 || list.Msg.HostTokens[0].Name != "rack 1" || list.Msg.HostTokens[0].RevokedAt == nil ||
			!slices.Equal(list.Msg.HostTokens[0].HostIds, []string{"h1", "h2"}) {
			t.Errorf("ListHostTokens: %v, %v", list, err)
		}
	})
}

// TestHostNameBelongsToItsToken: a host ID belongs to the host token it
// registered with: another token may neither register it, nor watch its
// assignments (which carry its workspaces' data-plane keys), nor report
// for it, until the first token is revoked. A token issued for named
// hosts registers no other.
func TestHostNameBelongsToItsToken(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		hostAPI := func(token string) hostv1connect.HostServiceClient {
			return hostv1connect.NewHostServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(token)))
		}
		newToken := func(name string, hosts ...string) (secret, id string) {
			t.Helper()
			created, err := e.admins.CreateHostToken(ctx, connect.NewRequest(&adminv1.CreateHostTokenRequest{Name: name, HostIds: hosts, AnyHost: hosts == nil}))
			if err != nil {
				t.Fatal(err)
			}
			return created.Msg.Secret, created.Msg.HostToken.GetHostTokenId()
		}
		register := func(token, host string) error {
			_, err := hostAPI(token).RegisterHost(ctx, connect.NewRequest(&hostv1.RegisterHostRequest{HostId: host,
				Capacity: &hostv1.HostCapacity{CpuMillis: 1000, MemoryBytes: 1 << 30, LayerBytes: 1 << 30}}))
			return err
		}
		a, aID := newToken("a")
		b, _ := newToken("b")

		// A token issued for h3 and h4 registers those, and no made-up
		// host, whether another token's or none's: the refusal names
		// neither the token nor another host.
		bound, boundID := newToken("bound", "h3", "h4")
		if err := errors.Join(register(bound, "h3"), register(bound, "h4")); err != nil {
			t.Errorf("registering the hosts of a bound token: %v", err)
		}
		if err := register(a, "h1"); err != nil {
			t.Fatal(err)
		}
		for _, host := range []string{"made-up", "h1"} {
			err := register(bound, host)
			wantCode(t, "RegisterHost of "+host+" with a token bound to h3 and h4", err, connect.CodePermissionDenied)
			if msg := fmt.Sprint(err); strings.Contains(msg, boundID) || strings.Contains(msg, "h3") || strings.Contains(msg, "h4") ||
				strings.Contains(msg, "another host token") {
				t.Errorf("the refusal %q names the token, its hosts, or the host's owner", msg)
			}
		}
		hosts, err := e.admins.ListHosts(ctx, connect.NewRequest(&adminv1.ListHostsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if len(hosts.Msg.Hosts) != 3 {
			t.Errorf("hosts = %v; want h1, h3 and h4 only", hosts.Msg.Hosts)
		}
		if err := register(a, "h1"); err != nil {
			t.Errorf("registering again with its own token: %v", err)
		}
		wantCode(t, "RegisterHost of another token's host", register(b, "h1"), connect.CodePermissionDenied)
		watch, err := hostAPI(b).WatchAssignments(ctx, connect.NewRequest(&hostv1.WatchAssignmentsRequest{HostId: "h1"}))
		if err == nil {
			if watch.Receive() {
				t.Errorf("another token watched h1's assignments: %v", watch.Msg())
			}
			err = watch.Err()
			watch.Close()
		}
		wantCode(t, "WatchAssignments of another token's host", err, connect.CodePermissionDenied)
		_, err = hostAPI(b).ReportExecutions(ctx, connect.NewRequest(&hostv1.ReportExecutionsRequest{HostId: "h1"}))
		wantCode(t, "ReportExecutions for another token's host", err, connect.CodePermissionDenied)
		if err := register(b, "h2"); err != nil {
			t.Errorf("registering a host of its own: %v", err)
		}

		// Once the first token is revoked, another takes the name.
		if _, err := e.admins.RevokeHostToken(ctx, connect.NewRequest(&adminv1.RevokeHostTokenRequest{HostTokenId: aID})); err != nil {
			t.Fatal(err)
		}
		if err := register(b, "h1"); err != nil {
			t.Errorf("registering the host of a revoked token: %v", err)
		}
		c, _ := newToken("c")
		wantCode(t, "RegisterHost of the host the second token took", register(c, "h1"), connect.CodePermissionDenied)
	})
}
