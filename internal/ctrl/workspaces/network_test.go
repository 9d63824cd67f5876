package workspaces

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil/fakeresolver"
)

const public = ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET

// putObject stores a live Egress or Resolver of project p1.
func putObject(t *testing.T, s *Service, ctx context.Context, kind store.Kind, id string, spec proto.Message) {
	t.Helper()
	body, err := proto.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Store.Update(ctx, func(tx store.Tx) error {
		return tx.CreateObject(ctx, store.Object{Kind: kind, ProjectID: "p1", ID: id, Spec: body, Revision: 1,
			LabelsRevision: 1, AnnotationsRevision: 1, CreatedAt: time.Now(), UpdatedAt: time.Now()})
	}); err != nil {
		t.Fatal(err)
	}
}

// policyObjects stores what the tests' policies reference: egr_tcp
// (without udp), egr_udp (udp_enabled), rsv_udp (a public udp upstream),
// rsv_tcp, and egr_gone, which is deleted.
func policyObjects(t *testing.T, s *Service, ctx context.Context) {
	t.Helper()
	socks := &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "93.184.216.34:1080"}}
	putObject(t, s, ctx, store.KindEgress, "egr_tcp", &ctrlv1.EgressSpec{Protocol: socks})
	putObject(t, s, ctx, store.KindEgress, "egr_udp", &ctrlv1.EgressSpec{Protocol: socks, UdpEnabled: true})
	putObject(t, s, ctx, store.KindEgress, "egr_gone", &ctrlv1.EgressSpec{Protocol: socks})
	putObject(t, s, ctx, store.KindResolver, "rsv_udp", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "9.9.9.9:53"}}})
	putObject(t, s, ctx, store.KindResolver, "rsv_tcp", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: "9.9.9.9:53"}}})
	if err := s.Store.Update(ctx, func(tx store.Tx) error {
		o, err := tx.Object(ctx, store.KindEgress, "p1", "egr_gone")
		if err != nil {
			return err
		}
		o.DeletedAt = time.Now()
		return tx.UpdateObject(ctx, o)
	}); err != nil {
		t.Fatal(err)
	}
}

func direct() *ctrlv1.ResolverPath {
	return &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_Direct{Direct: &ctrlv1.ResolverDirectPath{}}}
}

func through(egress string) *ctrlv1.ResolverPath {
	return &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_EgressId{EgressId: egress}}
}

// forwarding is a PUBLIC_INTERNET policy that sends destinations through
// egress and DNS to resolver on path.
func forwarding(egress string, destinations []string, resolver string, path *ctrlv1.ResolverPath) *ctrlv1.NetworkPolicy {
	return &ctrlv1.NetworkPolicy{Mode: public,
		Egresses:  []*ctrlv1.NetworkPolicyEgress{{EgressId: egress, Destinations: destinations}},
		Resolvers: []*ctrlv1.NetworkPolicyResolver{{ResolverId: resolver, Path: path}}}
}

// setPolicy sends an UpdateWorkspaceNetworkPolicyRequest as the handler
// does: the request, without its policy revision, is the command's input.
func setPolicy(s *Service, ctx context.Context, req *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) (*ctrlv1.Workspace, error) {
	input := proto.CloneOf(req)
	if input.Policy != nil {
		input.Policy.Revision = 0
	}
	w := Write[*ctrlv1.Workspace]{Method: "UpdateWorkspaceNetworkPolicy", Command: req.Command, Input: input, New: newWS}
	return UpdateNetworkPolicy(ctx, s, w, req.WorkspaceId, req.ExpectedRevision, req.Policy, req.DrainSeconds, identity)
}

func policyRequest(id string, expected uint64, p *ctrlv1.NetworkPolicy) *ctrlv1.UpdateWorkspaceNetworkPolicyRequest {
	return &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
		WorkspaceId: id, ExpectedRevision: expected, Policy: p}
}

// stored returns a workspace's record as ctrl keeps it.
func stored(t *testing.T, s *Service, ctx context.Context, id string) *record {
	t.Helper()
	var r *record
	if err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		r, err = s.load(ctx, tx, "p1", id)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

// referencing lists the workspaces whose policy holds ref.
func referencing(t *testing.T, s *Service, ctx context.Context, kind store.RefKind, target string) []string {
	t.Helper()
	var ids []string
	if err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		ids, err = tx.ReferencingWorkspaces(ctx, "p1", store.PolicyReference{Kind: kind, TargetID: target}, 10)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestUpdateNetworkPolicyRevisions(t *testing.T) {
	s, ctx := newService(t)
	policyObjects(t, s, ctx)
	id := create(t, s, ctx, 128<<20).WorkspaceId

	p := forwarding("egr_udp", []string{"10.0.0.0/8", "192.168.0.0/16"}, "rsv_udp", through("egr_udp"))
	p.Allow, p.Deny = []string{"93.184.216.34"}, []string{"2001:db8::/32"}
	ws, err := setPolicy(s, ctx, policyRequest(id, 1, p))
	if err != nil {
		t.Fatal(err)
	}
	want := proto.CloneOf(p)
	want.Revision = 2
	if got := ws.Spec.NetworkPolicy; !proto.Equal(got, want) {
		t.Errorf("after the first change: %v, want %v", got, want)
	}
	if d := stored(t, s, ctx, id).book.NetworkDrainSeconds; d != 600 {
		t.Errorf("drain without drain_seconds = %d, want 600", d)
	}

	// Equal content keeps the revision, the stored drain and updated_at;
	// the request's revision is ignored.
	same := proto.CloneOf(p)
	same.Revision = 99
	req := policyRequest(id, 2, same)
	req.DrainSeconds = proto.Uint32(5)
	again, err := setPolicy(s, ctx, req)
	if err != nil || again.Spec.NetworkPolicy.Revision != 2 || !again.UpdatedAt.AsTime().Equal(ws.UpdatedAt.AsTime()) {
		t.Errorf("equal content: %v, %v", again, err)
	}
	if d := stored(t, s, ctx, id).book.NetworkDrainSeconds; d != 600 {
		t.Errorf("equal content changed the drain to %d", d)
	}

	// A stale revision is aborted and changes nothing.
	_, err = setPolicy(s, ctx, policyRequest(id, 1, &ctrlv1.NetworkPolicy{}))
	if connect.CodeOf(err) != connect.CodeAborted {
		t.Errorf("stale expected_revision: %v", err)
	}
	if got, _ := s.Get(ctx, id); !proto.Equal(got, ws) {
		t.Errorf("aborted update changed the workspace:\n%v\nwant %v", got, ws)
	}

	// Reordering destinations is a content change; so is each list.
	reordered := proto.CloneOf(p)
	reordered.Egresses[0].Destinations = []string{"192.168.0.0/16", "10.0.0.0/8"}
	req = policyRequest(id, 2, reordered)
	req.DrainSeconds = proto.Uint32(0)
	if ws, err = setPolicy(s, ctx, req); err != nil || ws.Spec.NetworkPolicy.Revision != 3 {
		t.Fatalf("reordered destinations: %v, %v", ws, err)
	}
	if d := stored(t, s, ctx, id).book.NetworkDrainSeconds; d != 0 {
		t.Errorf("drain_seconds 0 stored as %d", d)
	}
	rev := uint64(3)
	for _, change := range []struct {
		name string
		edit func(*ctrlv1.NetworkPolicy)
	}{
		{"allow", func(p *ctrlv1.NetworkPolicy) { p.Allow = append(p.Allow, "1.1.1.1") }},
		{"allow order", func(p *ctrlv1.NetworkPolicy) { p.Allow[0], p.Allow[1] = p.Allow[1], p.Allow[0] }},
		{"deny", func(p *ctrlv1.NetworkPolicy) { p.Deny = nil }},
		{"resolver path", func(p *ctrlv1.NetworkPolicy) { p.Resolvers[0].Path = direct() }},
		{"resolver", func(p *ctrlv1.NetworkPolicy) { p.Resolvers[0].ResolverId = "rsv_tcp" }},
		{"egress entry", func(p *ctrlv1.NetworkPolicy) { p.Egresses[0].EgressId = "egr_tcp" }},
		{"no entries", func(p *ctrlv1.NetworkPolicy) { *p = ctrlv1.NetworkPolicy{Mode: public} }},
		{"deny-all", func(p *ctrlv1.NetworkPolicy) { *p = ctrlv1.NetworkPolicy{} }},
	} {
		next := proto.CloneOf(ws.Spec.NetworkPolicy)
		change.edit(next)
		req := policyRequest(id, rev, next)
		req.DrainSeconds = proto.Uint32(3600)
		got, err := setPolicy(s, ctx, req)
		if err != nil || got.Spec.NetworkPolicy.Revision != rev+1 {
			t.Fatalf("%s: %v, %v", change.name, got, err)
		}
		ws, rev = got, rev+1
	}
	if m := ws.Spec.NetworkPolicy.Mode; m != ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL {
		t.Errorf("an unspecified mode is stored as %v, want DENY_ALL", m)
	}
	if d := stored(t, s, ctx, id).book.NetworkDrainSeconds; d != 3600 {
		t.Errorf("drain = %d, want 3600", d)
	}
}

func TestUpdateNetworkPolicyRejectsBadInput(t *testing.T) {
	s, ctx := newService(t)
	policyObjects(t, s, ctx)
	id := create(t, s, ctx, 128<<20).WorkspaceId
	before, err := setPolicy(s, ctx, policyRequest(id, 1, forwarding("egr_udp", []string{"10.0.0.0/8"}, "rsv_udp", through("egr_udp"))))
	if err != nil {
		t.Fatal(err)
	}
	many := make([]string, MaxDestinations+1)
	for i := range many {
		many[i] = fmt.Sprintf("10.0.%d.%d", i/256, i%256)
	}
	invalid, notFound := connect.CodeInvalidArgument, connect.CodeNotFound
	for _, tc := range []struct {
		name   string
		policy *ctrlv1.NetworkPolicy
		edit   func(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest)
		code   connect.Code
	}{
		{name: "no policy", edit: func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.Policy = nil }, code: invalid},
		{name: "no expected revision", edit: func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.ExpectedRevision = 0 }, code: invalid},
		{name: "drain 3601", edit: func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.DrainSeconds = proto.Uint32(3601) }, code: invalid},
		{name: "no command id", edit: func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.Command = nil }, code: invalid},
		{name: "unknown mode", policy: &ctrlv1.NetworkPolicy{Mode: 7}, code: invalid},
		{name: "leading zero", policy: &ctrlv1.NetworkPolicy{Mode: public, Allow: []string{"10.0.0.01"}}, code: invalid},
		{name: "uppercase IPv6", policy: &ctrlv1.NetworkPolicy{Mode: public, Deny: []string{"2001:DB8::/32"}}, code: invalid},
		{name: "host bits", policy: &ctrlv1.NetworkPolicy{Mode: public, Deny: []string{"10.0.0.1/8"}}, code: invalid},
		{name: "entries under DENY_ALL", policy: &ctrlv1.NetworkPolicy{Allow: []string{"1.1.1.1"}}, code: invalid},
		{name: "egress under DENY_ALL", policy: &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL,
			Egresses: []*ctrlv1.NetworkPolicyEgress{{EgressId: "egr_tcp", Destinations: []string{"10.0.0.0/8"}}}}, code: invalid},
		{name: "two egresses", policy: &ctrlv1.NetworkPolicy{Mode: public, Egresses: []*ctrlv1.NetworkPolicyEgress{
			{EgressId: "egr_tcp", Destinations: []string{"10.0.0.0/8"}}, {EgressId: "egr_udp", Destinations: []string{"10.1.0.0/16"}}}}, code: invalid},
		{name: "two resolvers", policy: &ctrlv1.NetworkPolicy{Mode: public, Resolvers: []*ctrlv1.NetworkPolicyResolver{
			{ResolverId: "rsv_udp", Path: direct()}, {ResolverId: "rsv_tcp", Path: direct()}}}, code: invalid},
		{name: "no destinations", policy: forwarding("egr_tcp", nil, "rsv_tcp", direct()), code: invalid},
		{name: "257 destinations", policy: forwarding("egr_tcp", many, "rsv_tcp", direct()), code: invalid},
		{name: "destination with host bits", policy: forwarding("egr_tcp", []string{"10.0.0.1/8"}, "rsv_tcp", direct()), code: invalid},
		{name: "no path", policy: forwarding("egr_tcp", []string{"10.0.0.0/8"}, "rsv_tcp", nil), code: invalid},
		{name: "path egress not listed", policy: forwarding("egr_tcp", []string{"10.0.0.0/8"}, "rsv_tcp", through("egr_udp")), code: invalid},
		{name: "udp resolver without udp_enabled", policy: forwarding("egr_tcp", []string{"10.0.0.0/8"}, "rsv_udp", through("egr_tcp")), code: invalid},
		{name: "deleted egress", policy: forwarding("egr_gone", []string{"10.0.0.0/8"}, "rsv_tcp", direct()), code: notFound},
		{name: "missing egress", policy: forwarding("egr_none", []string{"10.0.0.0/8"}, "rsv_tcp", direct()), code: notFound},
		{name: "missing resolver", policy: forwarding("egr_tcp", []string{"10.0.0.0/8"}, "rsv_none", through("egr_tcp")), code: notFound},
		{name: "missing direct resolver", policy: forwarding("egr_tcp", []string{"10.0.0.0/8"}, "rsv_none", direct()), code: notFound},
	} {
		req := policyRequest(id, 2, tc.policy)
		if tc.policy == nil {
			req.Policy = &ctrlv1.NetworkPolicy{Mode: public}
		}
		if tc.edit != nil {
			tc.edit(req)
		}
		_, err := setPolicy(s, ctx, req)
		if connect.CodeOf(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}
	if got, _ := s.Get(ctx, id); !proto.Equal(got, before) {
		t.Errorf("refused updates changed the workspace:\n%v\nwant %v", got, before)
	}
	if got := referencing(t, s, ctx, store.RefEgressUDP, "egr_udp"); len(got) != 1 {
		t.Errorf("refused updates changed the references: %v", got)
	}
}

// TestUpdateNetworkPolicyReferences checks that an update replaces the
// references the workspace holds.
func TestUpdateNetworkPolicyReferences(t *testing.T) {
	s, ctx := newService(t)
	policyObjects(t, s, ctx)
	id := create(t, s, ctx, 128<<20).WorkspaceId
	if _, err := setPolicy(s, ctx, policyRequest(id, 1, forwarding("egr_udp", []string{"10.0.0.0/8"}, "rsv_udp", through("egr_udp")))); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []struct {
		kind   store.RefKind
		target string
	}{{store.RefEgress, "egr_udp"}, {store.RefEgressUDP, "egr_udp"}, {store.RefResolver, "rsv_udp"}} {
		if got := referencing(t, s, ctx, ref.kind, ref.target); len(got) != 1 || got[0] != id {
			t.Errorf("%s %s referenced by %v, want [%s]", ref.kind, ref.target, got, id)
		}
	}
	if _, err := setPolicy(s, ctx, policyRequest(id, 2, forwarding("egr_tcp", []string{"10.0.0.0/8"}, "rsv_tcp", through("egr_tcp")))); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"egr_udp", "rsv_udp"} {
		for _, kind := range []store.RefKind{store.RefEgress, store.RefEgressUDP, store.RefResolver} {
			if got := referencing(t, s, ctx, kind, target); len(got) != 0 {
				t.Errorf("%s %s still referenced by %v", kind, target, got)
			}
		}
	}
	if got := referencing(t, s, ctx, store.RefEgress, "egr_tcp"); len(got) != 1 {
		t.Errorf("egr_tcp referenced by %v", got)
	}
	if got := referencing(t, s, ctx, store.RefEgressUDP, "egr_tcp"); len(got) != 0 {
		t.Errorf("a tcp Resolver through egr_tcp holds its udp: %v", got)
	}
}

func TestUpdateNetworkPolicyReplay(t *testing.T) {
	s, ctx := newService(t)
	dns := fakeresolver.New(map[string][]netip.Addr{"dns.example.com": {netip.MustParseAddr("9.9.9.9")}})
	s.Checker = &netcheck.Checker{Resolver: dns}
	putObject(t, s, ctx, store.KindResolver, "rsv_name", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "dns.example.com:53"}}})
	id := create(t, s, ctx, 128<<20).WorkspaceId
	req := policyRequest(id, 1, &ctrlv1.NetworkPolicy{Mode: public, Allow: []string{"1.1.1.1"},
		Resolvers: []*ctrlv1.NetworkPolicyResolver{{ResolverId: "rsv_name", Path: direct()}}})
	req.DrainSeconds = proto.Uint32(30)
	first, err := setPolicy(s, ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := setPolicy(s, ctx, policyRequest(id, 2, &ctrlv1.NetworkPolicy{Mode: public})); err != nil {
		t.Fatal(err)
	}

	// The retry replays the first answer, although its revision is stale
	// and the upstream's name now resolves to a private address, and a
	// revision in the policy does not make it another command.
	dns.Set("dns.example.com", netip.MustParseAddr("10.0.0.53"))
	retry := proto.CloneOf(req)
	retry.Policy.Revision = 7
	replayed, err := setPolicy(s, ctx, retry)
	if err != nil || !proto.Equal(replayed, first) {
		t.Errorf("replay = %v, %v; want the first response %v", replayed, err, first)
	}
	if got, _ := s.Get(ctx, id); got.Spec.NetworkPolicy.Revision != 3 {
		t.Errorf("replay changed the revision to %d", got.Spec.NetworkPolicy.Revision)
	}
	for name, edit := range map[string]func(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest){
		"other drain":  func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.DrainSeconds = proto.Uint32(31) },
		"no drain":     func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.DrainSeconds = nil },
		"other policy": func(r *ctrlv1.UpdateWorkspaceNetworkPolicyRequest) { r.Policy.Allow = nil },
	} {
		other := proto.CloneOf(req)
		edit(other)
		if _, err := setPolicy(s, ctx, other); connect.CodeOf(err) != connect.CodeAlreadyExists {
			t.Errorf("same command_id, %s: %v", name, err)
		}
	}
}

// TestUpdateNetworkPolicyStates accepts the update in every state but
// DELETING and DELETED; a stopped workspace keeps it for its next start.
func TestUpdateNetworkPolicyStates(t *testing.T) {
	s, ctx := newService(t)
	id := create(t, s, ctx, 128<<20).WorkspaceId
	rev := uint64(1)
	set := func() error {
		ws, err := setPolicy(s, ctx, policyRequest(id, rev, &ctrlv1.NetworkPolicy{Mode: public, Allow: []string{fmt.Sprintf("1.1.1.%d", rev)}}))
		if err == nil {
			rev = ws.Spec.NetworkPolicy.Revision
		}
		return err
	}
	if err := set(); err != nil {
		t.Errorf("CREATING: %v", err)
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	if err := set(); err != nil {
		t.Errorf("AVAILABLE: %v", err)
	}
	if _, err := Stop(ctx, s, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
		t.Fatal(err)
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_STOPPED, nil)
	if err := set(); err != nil {
		t.Errorf("STOPPED: %v", err)
	}
	if rev != 4 {
		t.Errorf("revision %d after three changes, want 4", rev)
	}
	if _, err := Delete(ctx, s, write("delete", newWS), id, identity); err != nil {
		t.Fatal(err)
	}
	if err := set(); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("DELETING: %v", err)
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_DELETED, nil)
	if err := set(); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("DELETED: %v", err)
	}
}

// TestDirectResolverOnAPlatformRange: a Resolver on loopback, exempted by
// the operator's unsafe ranges, is refused on the direct path (no
// exemption opens a platform range to a guest's direct traffic, and every
// query would fail), and taken through an Egress.
func TestDirectResolverOnAPlatformRange(t *testing.T) {
	s, ctx := newService(t)
	s.Checker = &netcheck.Checker{Exempt: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}
	policyObjects(t, s, ctx)
	putObject(t, s, ctx, store.KindResolver, "rsv_lo", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "127.0.0.1:53"}}})
	id := create(t, s, ctx, 128<<20).WorkspaceId
	_, err := setPolicy(s, ctx, policyRequest(id, 1, forwarding("egr_udp", []string{"10.0.0.0/8"}, "rsv_lo", direct())))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "platform range 127.0.0.0/8") {
		t.Errorf("a loopback Resolver on the direct path: %v, want invalid_argument naming the platform range", err)
	}
	if _, err := setPolicy(s, ctx, policyRequest(id, 1, forwarding("egr_udp", []string{"10.0.0.0/8"}, "rsv_lo", through("egr_udp")))); err != nil {
		t.Errorf("a loopback Resolver through an Egress: %v", err)
	}
}
