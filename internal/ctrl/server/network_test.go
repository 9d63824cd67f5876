package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates/templatetest"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// workspaces returns a WorkspaceService client of the admin, after giving
// the store what creating a workspace needs beyond the API: a registered
// host (with a storage pool "default") and the built-in template.
func (e *env) workspaces() ctrlv1connect.WorkspaceServiceClient {
	e.t.Helper()
	ctx := context.Background()
	now := time.Now()
	reg, err := proto.Marshal(&hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: 4 << 30, LayerBytes: 10 << 30, DefaultLayerBytes: 1 << 30},
		StoragePools: []*hostv1.StoragePool{{Name: "default", DefaultVolumeBytes: 256 << 20}}})
	if err != nil {
		e.t.Fatal(err)
	}
	err = e.store.Update(ctx, func(tx store.Tx) error {
		if err := tx.PutHost(ctx, store.Host{ID: "h1", Body: reg, CPUMillis: 4000, MemoryBytes: 4 << 30, LayerBytes: 10 << 30, SeenAt: now}); err != nil {
			return err
		}
		return templatetest.PutDefault(ctx, tx, now)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return ctrlv1connect.NewWorkspaceServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(e.admin)))
}

// newWorkspace creates a workspace of the least memory and returns its ID.
func newWorkspace(t *testing.T, wsc ctrlv1connect.WorkspaceServiceClient) string {
	t.Helper()
	created := must[*connect.Response[ctrlv1.CreateWorkspaceResponse]](t, "create workspace")(
		wsc.CreateWorkspace(context.Background(), connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(),
			Spec: &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20}}})))
	return created.Msg.Workspace.WorkspaceId
}

func resolverThrough(egress string) *ctrlv1.ResolverPath {
	return &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_EgressId{EgressId: egress}}
}

func resolverDirect() *ctrlv1.ResolverPath {
	return &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_Direct{Direct: &ctrlv1.ResolverDirectPath{}}}
}

// forwarding is a PUBLIC_INTERNET policy that sends destinations through
// egress and DNS to resolver on path.
func forwarding(egress string, destinations []string, resolver string, path *ctrlv1.ResolverPath) *ctrlv1.NetworkPolicy {
	return &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET,
		Egresses:  []*ctrlv1.NetworkPolicyEgress{{EgressId: egress, Destinations: destinations}},
		Resolvers: []*ctrlv1.NetworkPolicyResolver{{ResolverId: resolver, Path: path}}}
}

func TestUpdateWorkspaceNetworkPolicy(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		wsc := e.workspaces()
		udp := socks5("93.184.216.34:1080")
		udp.UdpEnabled = true
		egUDP := e.createEgress(udp, nil).EgressId
		egTCP := e.createEgress(socks5("proxy.example.com:1080"), nil).EgressId
		gone := e.createEgress(socks5("93.184.216.34:1081"), nil).EgressId
		must[*connect.Response[ctrlv1.DeleteEgressResponse]](t, "delete egress")(
			e.egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Command: cmd(), EgressId: gone})))
		rsUDP := e.createResolver(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "10.0.0.53:53"}}}).ResolverId
		rsTCP := e.createResolver(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: "9.9.9.9:53"}}}).ResolverId
		id := newWorkspace(t, wsc)
		update := func(expected uint64, p *ctrlv1.NetworkPolicy) (*ctrlv1.Workspace, error) {
			resp, err := wsc.UpdateWorkspaceNetworkPolicy(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
				Command: cmd(), WorkspaceId: id, ExpectedRevision: expected, Policy: p}))
			if err != nil {
				return nil, err
			}
			return resp.Msg.Workspace, nil
		}
		get := func() *ctrlv1.Workspace {
			t.Helper()
			return must[*connect.Response[ctrlv1.GetWorkspaceResponse]](t, "get workspace")(
				wsc.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))).Msg.Workspace
		}
		deleteEgress := func(id string) error {
			_, err := e.egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Command: cmd(), EgressId: id}))
			return err
		}

		// A content change increments the revision; the request's is ignored.
		p := forwarding(egUDP, []string{"10.0.0.0/8", "192.168.0.0/16"}, rsUDP, resolverThrough(egUDP))
		p.Revision = 40
		ws, err := update(1, p)
		if err != nil || ws.Spec.NetworkPolicy.Revision != 2 {
			t.Fatalf("first update: %v, %v", ws, err)
		}
		err = deleteEgress(egUDP)
		wantCode(t, "delete the referenced egress", err, connect.CodeFailedPrecondition)
		if got := testutil.ErrorDetail(err).GetObservedWorkspace(); got.GetWorkspaceId() != id {
			t.Errorf("the refusal's observed workspace is %v, want %s", got, id)
		}

		_, err = update(1, &ctrlv1.NetworkPolicy{})
		wantCode(t, "stale expected_revision", err, connect.CodeAborted)
		if got := get(); !proto.Equal(got, ws) {
			t.Errorf("aborted update changed the workspace:\n%v\nwant %v", got, ws)
		}
		same, err := update(2, p)
		if err != nil || !proto.Equal(same, ws) {
			t.Errorf("equal content: %v, %v; want the workspace unchanged %v", same, err, ws)
		}

		// The destinations are kept in order: reordering them is a change.
		p.Egresses[0].Destinations = []string{"192.168.0.0/16", "10.0.0.0/8"}
		if ws, err = update(2, p); err != nil || ws.Spec.NetworkPolicy.Revision != 3 ||
			ws.Spec.NetworkPolicy.Egresses[0].Destinations[0] != "192.168.0.0/16" {
			t.Fatalf("reordered destinations: %v, %v", ws, err)
		}

		many := make([]string, workspaces.MaxDestinations+1)
		for i := range many {
			many[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		}
		public := ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET
		for _, tc := range []struct {
			name   string
			policy *ctrlv1.NetworkPolicy
			drain  *uint32
			code   connect.Code
		}{
			{"non-canonical CIDR", &ctrlv1.NetworkPolicy{Mode: public, Allow: []string{"10.0.0.01/32"}}, nil, connect.CodeInvalidArgument},
			{"host bits", &ctrlv1.NetworkPolicy{Mode: public, Deny: []string{"10.0.0.1/8"}}, nil, connect.CodeInvalidArgument},
			{"two egresses", &ctrlv1.NetworkPolicy{Mode: public, Egresses: []*ctrlv1.NetworkPolicyEgress{
				{EgressId: egTCP, Destinations: []string{"10.0.0.0/8"}}, {EgressId: egUDP, Destinations: []string{"10.1.0.0/16"}}}}, nil, connect.CodeInvalidArgument},
			{"two resolvers", &ctrlv1.NetworkPolicy{Mode: public, Resolvers: []*ctrlv1.NetworkPolicyResolver{
				{ResolverId: rsTCP, Path: resolverDirect()}, {ResolverId: rsUDP, Path: resolverThrough(egUDP)}}}, nil, connect.CodeInvalidArgument},
			{"entries under DENY_ALL", &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL,
				Deny: []string{"1.1.1.1"}}, nil, connect.CodeInvalidArgument},
			{"no destinations", forwarding(egTCP, nil, rsTCP, resolverDirect()), nil, connect.CodeInvalidArgument},
			{"257 destinations", forwarding(egTCP, many, rsTCP, resolverDirect()), nil, connect.CodeInvalidArgument},
			{"drain_seconds 3601", &ctrlv1.NetworkPolicy{Mode: public}, proto.Uint32(3601), connect.CodeInvalidArgument},
			{"no path", forwarding(egTCP, []string{"10.0.0.0/8"}, rsTCP, nil), nil, connect.CodeInvalidArgument},
			{"path egress not listed", forwarding(egTCP, []string{"10.0.0.0/8"}, rsTCP, resolverThrough(egUDP)), nil, connect.CodeInvalidArgument},
			{"udp resolver without udp_enabled", forwarding(egTCP, []string{"10.0.0.0/8"}, rsUDP, resolverThrough(egTCP)), nil, connect.CodeInvalidArgument},
			{"direct path to a private upstream", &ctrlv1.NetworkPolicy{Mode: public, Resolvers: []*ctrlv1.NetworkPolicyResolver{
				{ResolverId: rsUDP, Path: resolverDirect()}}}, nil, connect.CodeInvalidArgument},
			{"deleted egress", forwarding(gone, []string{"10.0.0.0/8"}, rsTCP, resolverDirect()), nil, connect.CodeNotFound},
		} {
			_, err := wsc.UpdateWorkspaceNetworkPolicy(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
				Command: cmd(), WorkspaceId: id, ExpectedRevision: 3, Policy: tc.policy, DrainSeconds: tc.drain}))
			wantCode(t, tc.name, err, tc.code)
		}
		if got := get(); !proto.Equal(got, ws) {
			t.Errorf("refused updates changed the workspace:\n%v\nwant %v", got, ws)
		}

		// Once the policy no longer references egUDP it can be deleted;
		// egTCP, which the new policy references, cannot.
		if ws, err = update(3, forwarding(egTCP, []string{"10.0.0.0/8"}, rsTCP, resolverDirect())); err != nil || ws.Spec.NetworkPolicy.Revision != 4 {
			t.Fatalf("switch to egTCP: %v, %v", ws, err)
		}
		if err := deleteEgress(egUDP); err != nil {
			t.Errorf("delete the egress the policy no longer references: %v", err)
		}
		wantCode(t, "delete the newly referenced egress", deleteEgress(egTCP), connect.CodeFailedPrecondition)
	})
}

// TestUpdateWorkspaceNetworkPolicyReplay retries an update with its
// command_id after a later change: the answer is the first one, byte for
// byte, and the same command_id with another input is already_exists.
func TestUpdateWorkspaceNetworkPolicyReplay(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		const procedure = "/kibotos.ctrl.v1.WorkspaceService/UpdateWorkspaceNetworkPolicy"
		ctx := context.Background()
		wsc := e.workspaces()
		id := newWorkspace(t, wsc)
		public := ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET

		req := &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{Command: &ctrlv1.CommandMetadata{CommandId: "policy-proto"}, WorkspaceId: id,
			ExpectedRevision: 1, Policy: &ctrlv1.NetworkPolicy{Mode: public, Allow: []string{"1.1.1.1", "2606:4700::/32"}}, DrainSeconds: proto.Uint32(60)}
		raw, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		status, first := e.post(procedure, "application/proto", raw)
		if status != http.StatusOK {
			t.Fatalf("update: %d %q", status, first)
		}
		body := fmt.Sprintf(`{"command":{"commandId":"policy-json"},"workspaceId":%q,"expectedRevision":"2","policy":{"mode":"NETWORK_POLICY_MODE_DENY_ALL"}}`, id)
		status, firstJSON := e.post(procedure, "application/json", []byte(body))
		if status != http.StatusOK {
			t.Fatalf("JSON update: %d %s", status, firstJSON)
		}
		for range 2 {
			if status, again := e.post(procedure, "application/proto", raw); status != http.StatusOK || !bytes.Equal(again, first) {
				t.Fatalf("binary replay differs: %d", status)
			}
			if status, again := e.post(procedure, "application/json", []byte(body)); status != http.StatusOK || !bytes.Equal(again, firstJSON) {
				t.Fatalf("JSON replay differs:\nfirst %s\nagain %d %s", firstJSON, status, again)
			}
		}
		// A policy revision in the request does not make it another command.
		withRevision := proto.CloneOf(req)
		withRevision.Policy.Revision = 9
		if raw, err = proto.Marshal(withRevision); err != nil {
			t.Fatal(err)
		}
		if status, again := e.post(procedure, "application/proto", raw); status != http.StatusOK || !bytes.Equal(again, first) {
			t.Errorf("replay with a policy revision differs: %d", status)
		}

		for name, edit := range map[string]func(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest){
			"other drain_seconds": func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.DrainSeconds = nil },
			"other allow order": func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) {
				r.Policy.Allow = []string{"2606:4700::/32", "1.1.1.1"}
			},
		} {
			other := proto.CloneOf(req)
			edit(other)
			_, err := wsc.UpdateWorkspaceNetworkPolicy(ctx, connect.NewRequest(other))
			wantCode(t, "same command_id, "+name, err, connect.CodeAlreadyExists)
		}
		got := must[*connect.Response[ctrlv1.GetWorkspaceResponse]](t, "get workspace")(
			wsc.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))).Msg.Workspace
		if p := got.Spec.NetworkPolicy; p.Revision != 3 || p.Mode != ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL {
			t.Errorf("policy after the replays: %v, want DENY_ALL at revision 3", p)
		}
	})
}
