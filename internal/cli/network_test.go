package cli

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

var (
	publicInternet = ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET
	throughEgr1    = &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_EgressId{EgressId: "egr_1"}}
)

// networkWorkspace is a Workspace at policy revision 5 whose host applied
// revision 4 and still drains revision 3, with one fault of each kind.
func networkWorkspace() *ctrlv1.Workspace {
	ws := testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	ws.UpdatedAt = created
	ws.Spec.NetworkPolicy = &ctrlv1.NetworkPolicy{Mode: publicInternet, Revision: 5,
		Allow: []string{"1.1.1.1"}, Deny: []string{"10.0.0.0/8", "2001:db8::/32"},
		Egresses:  []*ctrlv1.NetworkPolicyEgress{{EgressId: "egr_1", Destinations: []string{"10.1.0.0/16", "192.168.0.0/16"}}},
		Resolvers: []*ctrlv1.NetworkPolicyResolver{{ResolverId: "rsv_1", Path: throughEgr1}}}
	ws.NetworkPolicyStatus = &ctrlv1.NetworkPolicyStatus{AppliedRevision: 4, AppliedAt: created, DrainingRevision: 3,
		Egresses:  []*ctrlv1.NetworkPolicyEgressStatus{{EgressId: "egr_1", AppliedRevision: 2}},
		Resolvers: []*ctrlv1.NetworkPolicyResolverStatus{{ResolverId: "rsv_1", Path: throughEgr1, AppliedRevision: 7, DrainingRevision: 6}}}
	ws.EgressObservations = []*ctrlv1.EgressObservation{{EgressId: "egr_1",
		Kind: ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_AUTHENTICATION_FAILED, FailingSince: created, ObservedAt: created, Error: "bad password"}}
	ws.ResolverObservations = []*ctrlv1.ResolverObservation{{ResolverId: "rsv_1", Path: throughEgr1,
		Kind: ctrlv1.ResolverObservationKind_RESOLVER_OBSERVATION_KIND_UPSTREAM_TIMEOUT, FailingSince: created, ObservedAt: created}}
	return ws
}

// fields returns the lines of out with their cells separated by one space.
func fields(out string) []string {
	var lines []string
	for l := range strings.SplitSeq(strings.TrimRight(out, "\n"), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return lines
}

// wantFields fails t unless stdout, with its runs of blanks folded, is the
// lines of want; name says what printed it.
func wantFields(t *testing.T, name, stdout string, want []string) {
	t.Helper()
	if got := strings.Join(fields(stdout), "\n"); got != strings.Join(want, "\n") {
		t.Errorf("%s:\n%s\nwant\n%s", name, got, strings.Join(want, "\n"))
	}
}

func TestNetworkGet(t *testing.T) {
	e, f := newCtrlEnv(t)
	f.ws = networkWorkspace()
	stdout, _ := e.call(t, "", "ws", "network", "get", "ws_1")
	want := []string{
		"WORKSPACE ws_1",
		"MODE PUBLIC_INTERNET",
		"REVISION 5",
		"APPLIED_REVISION 4",
		"APPLIED_AT 2025-03-01T12:00:00Z",
		"DRAINING_REVISION 3",
		"ALLOW 1.1.1.1",
		"DENY 10.0.0.0/8,2001:db8::/32",
		"",
		"EGRESS DESTINATIONS APPLIED_REVISION DRAINING_REVISION",
		"egr_1 10.1.0.0/16,192.168.0.0/16 2 -",
		"",
		"RESOLVER PATH APPLIED_REVISION DRAINING_REVISION",
		"rsv_1 egress:egr_1 7 6",
		"",
		"FAULT OF KIND FAILING_SINCE OBSERVED_AT ERROR",
		"egress egr_1 AUTHENTICATION_FAILED 2025-03-01T12:00:00Z 2025-03-01T12:00:00Z bad password",
		"resolver rsv_1@egress:egr_1 UPSTREAM_TIMEOUT 2025-03-01T12:00:00Z 2025-03-01T12:00:00Z -",
	}
	wantFields(t, "get", stdout, want)

	// Before the host confirms anything there is no status.
	f.ws = testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_CREATING)
	f.ws.Spec.NetworkPolicy = &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, Revision: 1}
	stdout, _ = e.call(t, "", "ws", "network", "get", "ws_1")
	if got := fields(stdout); len(got) != 8 || got[1] != "MODE DENY_ALL" || got[3] != "APPLIED_REVISION -" || got[5] != "DRAINING_REVISION -" {
		t.Errorf("get without status:\n%s", stdout)
	}

	stdout, _ = e.call(t, "", "ws", "network", "get", "ws_1", "-o", "json")
	var resp ctrlv1.GetWorkspaceResponse
	if err := protojson.Unmarshal([]byte(stdout), &resp); err != nil || !proto.Equal(resp.GetWorkspace(), f.ws) {
		t.Errorf("-o json = %v (%v), want the GetWorkspaceResponse", &resp, err)
	}
}

// newNetworkEnv is newPlacedEnv with a workspace and a TCP Resolver that
// its policy may send through the env's Egress.
func newNetworkEnv(t *testing.T) (e *env, ws *ctrlv1.Workspace, resolverID string) {
	t.Helper()
	e = newPlacedEnv(t)
	ws = e.createWorkspace(t)
	var resp ctrlv1.CreateResolverResponse
	e.callJSON(t, &resp, "resolver", "create", "--tcp", "dns.example:53", "-o", "json")
	return e, ws, resp.GetResolver().GetResolverId()
}

// policy reads a workspace's stored network policy from the server.
func (e *env) policy(t *testing.T, id string) *ctrlv1.NetworkPolicy {
	t.Helper()
	return e.workspace(t, id).GetSpec().GetNetworkPolicy()
}

func TestNetworkSetSendsPolicy(t *testing.T) {
	e, ws, rsv := newNetworkEnv(t)
	id, egr := ws.GetWorkspaceId(), e.egress.GetEgressId()
	rev := ws.GetSpec().GetNetworkPolicy().GetRevision()
	through := &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_EgressId{EgressId: egr}}

	stdout, _ := e.call(t, "", "ws", "network", "set", id, "--mode", "public-internet",
		"--allow", "1.1.1.1", "--deny", "10.0.0.0/8", "--deny", "2001:db8::/32",
		"--egress", egr+"=10.1.0.0/16,192.168.0.0/16", "--resolver", rsv+"@egress:"+egr, "--drain", "2m", "--command-id", "c1")
	calls, _, reqs := e.got()
	if got := strings.Join(calls, ","); got != "GetWorkspace,UpdateWorkspaceNetworkPolicy" {
		t.Fatalf("calls = %s", got)
	}
	policy := &ctrlv1.NetworkPolicy{Mode: publicInternet, Allow: []string{"1.1.1.1"}, Deny: []string{"10.0.0.0/8", "2001:db8::/32"},
		Egresses:  []*ctrlv1.NetworkPolicyEgress{{EgressId: egr, Destinations: []string{"10.1.0.0/16", "192.168.0.0/16"}}},
		Resolvers: []*ctrlv1.NetworkPolicyResolver{{ResolverId: rsv, Path: through}}}
	want := &ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: "c1"}, WorkspaceId: id, ExpectedRevision: rev, DrainSeconds: proto.Uint32(120), Policy: policy,
	}
	if !proto.Equal(reqs[1], want) {
		t.Errorf("set = %v\nwant %v", reqs[1], want)
	}
	stored := proto.CloneOf(policy)
	stored.Revision = rev + 1
	if got := e.policy(t, id); !proto.Equal(got, stored) {
		t.Errorf("stored policy = %v\nwant %v", got, stored)
	}
	// No host has applied it yet.
	if got := fields(stdout); got[2] != fmt.Sprintf("REVISION %d", rev+1) || got[3] != "APPLIED_REVISION -" {
		t.Errorf("set shows:\n%s", stdout)
	}

	// A stale --expected-revision is refused and changes nothing.
	stale := strconv.FormatUint(rev, 10)
	if _, _, err := e.run(t, "", "ws", "network", "set", id, "--mode", "deny-all", "--expected-revision", stale,
		"--addr", e.addr, "--token", e.token); err == nil || !strings.Contains(err.Error(), "aborted") {
		t.Errorf("set at a stale revision: %v, want aborted", err)
	}
	if got := e.policy(t, id); !proto.Equal(got, stored) {
		t.Errorf("a refused set changed the policy to %v", got)
	}

	e.call(t, "", "ws", "network", "set", id, "--mode", "deny-all", "--expected-revision", strconv.FormatUint(rev+1, 10), "--drain-seconds", "0")
	_, _, reqs = e.got()
	if r := reqs[0].(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest); r.DrainSeconds == nil || *r.DrainSeconds != 0 {
		t.Errorf("set --drain-seconds 0 = %v", r)
	}
	if got, want := e.policy(t, id), (&ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL, Revision: rev + 2}); !proto.Equal(got, want) {
		t.Errorf("after set deny-all: %v, want %v", got, want)
	}

	e.call(t, "", "ws", "network", "set", id, "--mode", "public-internet", "--resolver", rsv)
	_, _, reqs = e.got()
	if r := reqs[len(reqs)-1].(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest); r.DrainSeconds != nil || r.GetExpectedRevision() != rev+2 {
		t.Errorf("set without --drain or --expected-revision = %v, want no drain at revision %d", r, rev+2)
	}
	direct := &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_Direct{Direct: &ctrlv1.ResolverDirectPath{}}}
	if got := e.policy(t, id).GetResolvers(); len(got) != 1 || !proto.Equal(got[0], &ctrlv1.NetworkPolicyResolver{ResolverId: rsv, Path: direct}) {
		t.Errorf("--resolver without a path stored %v, want direct", got)
	}
}

func TestNetworkSetRejectsBadInput(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, `"mode" not set`},
		{[]string{"--mode", "open"}, "deny-all or public-internet"},
		{[]string{"--mode", "public-internet", "--egress", "egr_1"}, "EGRESS_ID=DEST"},
		{[]string{"--mode", "public-internet", "--egress", "=10.0.0.0/8"}, "EGRESS_ID=DEST"},
		{[]string{"--mode", "public-internet", "--resolver", "rsv_1@tcp"}, "RESOLVER_ID@egress:EGRESS_ID"},
		{[]string{"--mode", "public-internet", "--resolver", "@direct"}, "RESOLVER_ID@direct"},
		{[]string{"--mode", "public-internet", "--resolver", "rsv_1@egress:"}, "RESOLVER_ID@egress:EGRESS_ID"},
		{[]string{"--mode", "deny-all", "--drain", "1500ms"}, "whole seconds"},
		{[]string{"--mode", "deny-all", "--drain", "-1s"}, "whole seconds"},
		{[]string{"--mode", "deny-all", "--drain", "1m", "--drain-seconds", "60"}, "drain"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, _, err := e.run(t, "", append([]string{"ws", "network", "set", "ws_1", "--addr", e.addr, "--token", e.token}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if calls, _, _ := e.got(); len(calls) != 0 {
				t.Errorf("calls = %v, want none", calls)
			}
		})
	}
}

func TestNetworkAllowDeny(t *testing.T) {
	e, ws, _ := newNetworkEnv(t)
	id := ws.GetWorkspaceId()
	e.call(t, "", "ws", "network", "set", id, "--mode", "public-internet", "--allow", "1.1.1.1", "--deny", "10.0.0.0/8", "--deny", "2001:db8::/32")
	before := e.policy(t, id)

	e.call(t, "", "ws", "network", "allow", id, "8.8.8.8", "1.1.1.1", "2606:4700::/32")
	calls, _, reqs := e.got()
	if got := strings.Join(calls, ","); got != "GetWorkspace,UpdateWorkspaceNetworkPolicy" {
		t.Fatalf("calls = %s", got)
	}
	allow := reqs[1].(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest)
	if allow.GetExpectedRevision() != before.GetRevision() || allow.DrainSeconds != nil {
		t.Errorf("allow = %v, want revision %d and no drain", allow, before.GetRevision())
	}
	// Entries are appended once; the rest of the policy goes back as read.
	want := proto.CloneOf(before)
	want.Allow, want.Revision = []string{"1.1.1.1", "8.8.8.8", "2606:4700::/32"}, before.GetRevision()+1
	if got := e.policy(t, id); !proto.Equal(got, want) {
		t.Errorf("after allow: %v\nwant %v", got, want)
	}

	e.call(t, "", "ws", "network", "deny", id, "10.0.0.0/8", "--remove", "--expected-revision", strconv.FormatUint(want.GetRevision(), 10), "--drain", "30s")
	calls, _, reqs = e.got()
	if got := strings.Join(calls, ","); got != "GetWorkspace,UpdateWorkspaceNetworkPolicy" {
		t.Fatalf("calls = %s", got)
	}
	deny := reqs[1].(*ctrlv1.UpdateWorkspaceNetworkPolicyRequest)
	if deny.GetDrainSeconds() != 30 {
		t.Errorf("deny --drain 30s = %v", deny)
	}
	want.Deny, want.Revision = []string{"2001:db8::/32"}, want.GetRevision()+1
	if got := e.policy(t, id); !proto.Equal(got, want) {
		t.Errorf("after deny --remove: %v\nwant %v", got, want)
	}
	if deny.GetCommand().GetCommandId() == allow.GetCommand().GetCommandId() {
		t.Error("two commands share a command_id")
	}
}

func TestNetworkWatch(t *testing.T) {
	e, f := newCtrlEnv(t)
	first := networkWorkspace()
	first.NetworkPolicyStatus, first.EgressObservations, first.ResolverObservations = nil, nil, nil
	report := proto.CloneOf(first) // a host report that changes nothing shown
	report.UpdatedAt = timestamppb.New(created.AsTime().Add(time.Second))
	applied := proto.CloneOf(report)
	applied.NetworkPolicyStatus = &ctrlv1.NetworkPolicyStatus{AppliedRevision: 5, DrainingRevision: 4}
	faulty := networkWorkspace()
	faulty.UpdatedAt = timestamppb.New(created.AsTime().Add(2 * time.Second))
	// Only an Egress's applied revision moves: a line too.
	egressMoved := proto.CloneOf(faulty)
	egressMoved.UpdatedAt = timestamppb.New(created.AsTime().Add(3 * time.Second))
	egressMoved.NetworkPolicyStatus.Egresses[0].AppliedRevision, egressMoved.NetworkPolicyStatus.Egresses[0].DrainingRevision = 3, 2
	deleted := proto.CloneOf(egressMoved) // the stream's last: it ends with it
	deleted.State, deleted.UpdatedAt = ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED, timestamppb.New(created.AsTime().Add(4*time.Second))
	// A deleted workspace's network is observed no more, as a real
	// deletion's last version says.
	deleted.NetworkPolicyStatus = nil
	f.watch = []*ctrlv1.Workspace{first, report, applied, faulty, egressMoved, deleted}

	stdout, stderr := e.call(t, "", "ws", "network", "watch", "ws_1")
	if stderr != "workspace ws_1 was deleted\n" {
		t.Errorf("watch of a workspace deleted: stderr %q, want it to say so", stderr)
	}
	want := []string{
		"UPDATED REVISION APPLIED_REVISION DRAINING_REVISION PATHS EGRESS_FAULTS RESOLVER_FAULTS",
		"2025-03-01T12:00:00Z 5 - - - - -",
		"2025-03-01T12:00:01Z 5 5 4 - - -",
		"2025-03-01T12:00:02Z 5 4 3 egr_1@2,rsv_1@7(draining 6) egr_1:AUTHENTICATION_FAILED rsv_1@egress:egr_1:UPSTREAM_TIMEOUT",
		"2025-03-01T12:00:03Z 5 4 3 egr_1@3(draining 2),rsv_1@7(draining 6) egr_1:AUTHENTICATION_FAILED rsv_1@egress:egr_1:UPSTREAM_TIMEOUT",
	}
	wantFields(t, "watch", stdout, want)

	stdout, _ = e.call(t, "", "ws", "network", "watch", "ws_1", "-o", "json")
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d JSON lines, want 4:\n%s", len(lines), stdout)
	}
	for i, ws := range []*ctrlv1.Workspace{first, applied, faulty, egressMoved} {
		var m ctrlv1.WatchWorkspaceResponse
		if err := protojson.Unmarshal([]byte(lines[i]), &m); err != nil || !proto.Equal(m.GetWorkspace(), ws) {
			t.Errorf("line %d = %v (%v), want %v", i, &m, err, ws)
		}
	}
}
