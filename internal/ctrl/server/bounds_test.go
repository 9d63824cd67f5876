package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/meta"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// labels returns n distinct labels.
func labels(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	return m
}

// prefixes returns n distinct canonical IPv4 prefixes.
func prefixes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
	}
	return out
}

// TestBoundsAreCheckedAtTheCall sends values past every bound a later
// stage would trip on (the runtime's CPU quota, a pool's largest disk
// image) or that has no use but to grow what every read and host carries
// (label count, policy entries): each is invalid_argument at the call and
// stores nothing, and the bound itself is accepted.
func TestBoundsAreCheckedAtTheCall(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		wsc := e.workspaces()
		vols := ctrlv1connect.NewVolumeServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(e.admin)))
		countWorkspaces := func() int {
			t.Helper()
			return len(must[*connect.Response[ctrlv1.ListWorkspacesResponse]](t, "list workspaces")(
				wsc.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{PageSize: 1000}))).Msg.Workspaces)
		}
		countVolumes := func() int {
			t.Helper()
			return len(must[*connect.Response[ctrlv1.ListVolumesResponse]](t, "list volumes")(
				vols.ListVolumes(ctx, connect.NewRequest(&ctrlv1.ListVolumesRequest{PageSize: 1000}))).Msg.Volumes)
		}
		createWS := func(cpu uint32, policy *ctrlv1.NetworkPolicy, l map[string]string) (*ctrlv1.Workspace, error) {
			resp, err := wsc.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Labels: l,
				Spec: &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: cpu, MemoryBytes: 128 << 20},
					NetworkPolicy: policy}}))
			if err != nil {
				return nil, err
			}
			return resp.Msg.Workspace, nil
		}
		public := func(allow, deny []string) *ctrlv1.NetworkPolicy {
			return &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, Allow: allow, Deny: deny}
		}

		// CPU: below what the runtime's CFS quota accepts.
		for _, cpu := range []uint32{1, workspaces.MinCPUMillis - 1} {
			_, err := createWS(cpu, nil, nil)
			wantCode(t, fmt.Sprintf("cpu_millis %d", cpu), err, connect.CodeInvalidArgument)
		}
		// Labels: one more than the limit, on create.
		_, err := createWS(0, nil, labels(meta.MaxLabels+1))
		wantCode(t, "workspace with too many labels", err, connect.CodeInvalidArgument)
		// Network policy: one entry more than the limit in either list.
		_, err = createWS(0, public(prefixes(workspaces.MaxPolicyEntries+1), nil), nil)
		wantCode(t, "create with too many allow entries", err, connect.CodeInvalidArgument)
		_, err = createWS(0, public(nil, prefixes(workspaces.MaxPolicyEntries+1)), nil)
		wantCode(t, "create with too many deny entries", err, connect.CodeInvalidArgument)
		if n := countWorkspaces(); n != 0 {
			t.Errorf("refused creations stored %d workspaces", n)
		}

		// The bounds themselves are accepted.
		ws, err := createWS(workspaces.MinCPUMillis, public(prefixes(workspaces.MaxPolicyEntries), nil), labels(meta.MaxLabels))
		if err != nil {
			t.Fatalf("create at every bound: %v", err)
		}
		if ws.Spec.Resources.CpuMillis != workspaces.MinCPUMillis {
			t.Errorf("cpu_millis %d, want %d", ws.Spec.Resources.CpuMillis, workspaces.MinCPUMillis)
		}
		id := ws.WorkspaceId
		get := func() *ctrlv1.Workspace {
			t.Helper()
			return must[*connect.Response[ctrlv1.GetWorkspaceResponse]](t, "get workspace")(
				wsc.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))).Msg.Workspace
		}
		_, err = wsc.UpdateWorkspaceNetworkPolicy(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
			Command: cmd(), WorkspaceId: id, ExpectedRevision: 1, Policy: public(nil, prefixes(workspaces.MaxPolicyEntries+1))}))
		wantCode(t, "update with too many deny entries", err, connect.CodeInvalidArgument)
		_, err = wsc.UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{
			Command: cmd(), WorkspaceId: id, ExpectedLabelsRevision: 1, Labels: labels(meta.MaxLabels + 1)}))
		wantCode(t, "update with too many labels", err, connect.CodeInvalidArgument)
		_, err = wsc.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{LabelSelector: labels(meta.MaxLabels + 1)}))
		wantCode(t, "selector with too many entries", err, connect.CodeInvalidArgument)
		if got := get(); !proto.Equal(got, ws) {
			t.Errorf("refused updates changed the workspace:\n%v\nwant %v", got, ws)
		}

		// Labels and annotations of every other resource follow the same rules.
		_, err = e.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{
			Command: cmd(), Spec: socks5("93.184.216.34:1080"), Labels: labels(meta.MaxLabels + 1)}))
		wantCode(t, "egress with too many labels", err, connect.CodeInvalidArgument)
		_, err = e.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{
			Command: cmd(), Spec: socks5("93.184.216.34:1080"), Annotations: map[string]string{"a": strings.Repeat("x", meta.MaxAnnotationsSize)}}))
		wantCode(t, "egress with annotations over 256 KiB", err, connect.CodeInvalidArgument)
		if n := e.countEgresses(); n != 0 {
			t.Errorf("refused creations stored %d Egresses", n)
		}
		e.createEgress(socks5("93.184.216.34:1080"), labels(meta.MaxLabels))

		// Volume capacity: above the largest disk image a pool can hold.
		for _, bytes := range []uint64{1 << 60, volumes.MaxVolumeBytes + volumes.MiB} {
			_, err := vols.CreateVolume(ctx, connect.NewRequest(&ctrlv1.CreateVolumeRequest{Command: cmd(),
				Spec: &ctrlv1.VolumeSpec{CapacityBytes: bytes}}))
			wantCode(t, fmt.Sprintf("volume of %d bytes", bytes), err, connect.CodeInvalidArgument)
		}
		if n := countVolumes(); n != 0 {
			t.Errorf("refused creations stored %d volumes", n)
		}
		v := must[*connect.Response[ctrlv1.CreateVolumeResponse]](t, "volume of the largest capacity")(
			vols.CreateVolume(ctx, connect.NewRequest(&ctrlv1.CreateVolumeRequest{Command: cmd(),
				Spec: &ctrlv1.VolumeSpec{CapacityBytes: volumes.MaxVolumeBytes}}))).Msg.Volume
		small := must[*connect.Response[ctrlv1.CreateVolumeResponse]](t, "volume")(
			vols.CreateVolume(ctx, connect.NewRequest(&ctrlv1.CreateVolumeRequest{Command: cmd(),
				Spec: &ctrlv1.VolumeSpec{CapacityBytes: 64 << 20}}))).Msg.Volume
		_, err = vols.ResizeVolume(ctx, connect.NewRequest(&ctrlv1.ResizeVolumeRequest{Command: cmd(),
			VolumeId: small.VolumeId, CapacityBytes: 1 << 60}))
		wantCode(t, "resize to 1 EiB", err, connect.CodeInvalidArgument)
		got := must[*connect.Response[ctrlv1.GetVolumeResponse]](t, "get volume")(
			vols.GetVolume(ctx, connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: small.VolumeId}))).Msg.Volume
		if got.Spec.CapacityBytes != 64<<20 || got.State != small.State {
			t.Errorf("refused resize changed the volume: %v", got)
		}
		if v.Spec.CapacityBytes != volumes.MaxVolumeBytes {
			t.Errorf("capacity %d, want %d", v.Spec.CapacityBytes, uint64(volumes.MaxVolumeBytes))
		}
	})
}

// TestClearingExpirationKeepsItsRevision checks that expiration.revision
// moves on through a clear, as through every change, and that a clear of
// nothing keeps it.
func TestClearingExpirationKeepsItsRevision(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		wsc := e.workspaces()
		id := newWorkspace(t, wsc)
		set := &ctrlv1.WorkspaceExpirationChange{Change: &ctrlv1.WorkspaceExpirationChange_Set{Set: &ctrlv1.WorkspaceExpirationPolicy{
			Deadline: timestamppb.New(time.Now().Add(time.Hour)), Action: ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_STOP}}}
		clear := &ctrlv1.WorkspaceExpirationChange{Change: &ctrlv1.WorkspaceExpirationChange_Clear{Clear: &emptypb.Empty{}}}
		for i, step := range []struct {
			change   *ctrlv1.WorkspaceExpirationChange
			revision uint64
			policy   bool
		}{
			{set, 1, true},
			{clear, 2, false},
			{clear, 2, false}, // clearing nothing is idempotent
			{set, 3, true},
		} {
			resp, err := wsc.UpdateWorkspaceExpiration(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceExpirationRequest{
				Command: cmd(), WorkspaceId: id, Change: step.change}))
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			read := must[*connect.Response[ctrlv1.GetWorkspaceResponse]](t, "get workspace")(
				wsc.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))).Msg.Workspace
			for what, ws := range map[string]*ctrlv1.Workspace{"response": resp.Msg.Workspace, "read": read} {
				exp := ws.GetExpiration()
				if exp.GetRevision() != step.revision || (exp.GetPolicy() != nil) != step.policy {
					t.Errorf("step %d %s: expiration %v, want revision %d with policy %v", i, what, exp, step.revision, step.policy)
				}
			}
		}
	})
}

// TestListPagesBoundedInBytes: a page of Egresses carrying 200 KiB of
// annotations each stops once it holds resource.PageBytes, with a next
// page token, however many page_size asks for; the pages together hold
// every Egress once, in order. Without the bound one call of 1,000 such
// objects read and sent 200 MB.
func TestListPagesBoundedInBytes(t *testing.T) {
	e := newEnv(t, testutil.SQLiteStore(t))
	var want []string
	// Small objects: a page has its size, read in batches of rows.
	for range 150 {
		want = append(want, e.createEgress(socks5("93.184.216.34:1080"), nil).GetEgressId())
	}
	var sizes []int
	for token := ""; ; {
		resp, err := e.egress.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{PageSize: 100, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(resp.Msg.GetEgresses()))
		if token = resp.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	if !slices.Equal(sizes, []int{100, 50}) {
		t.Errorf("150 small objects in pages of %v, want [100 50]", sizes)
	}

	big := strings.Repeat("x", 200<<10)
	for range 30 {
		resp, err := e.egress.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{
			Command: cmd(), Spec: socks5("93.184.216.34:1080"), Annotations: map[string]string{"big": big}}))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, resp.Msg.GetEgress().GetEgressId())
	}
	var got []string
	pages, token := 0, ""
	for {
		resp, err := e.egress.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{PageSize: 1000, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		pages++
		size := 0
		for _, eg := range resp.Msg.GetEgresses() {
			got = append(got, eg.GetEgressId())
			size += len(eg.GetAnnotations()["big"])
		}
		// At most one object past the bound: the one that reached it.
		if size > resource.PageBytes+len(big) {
			t.Errorf("page %d carries %d bytes of annotations, more than %d and one object", pages, size, resource.PageBytes)
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the pages listed %v, want %v", got, want)
	}
	if pages < 2 {
		t.Errorf("150 small objects and 30 of 200 KiB came in %d pages, want the bound to cut them", pages)
	}

	// Templates, listed in their own order, are cut alike.
	templates := ctrlv1connect.NewTemplateServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(e.admin)))
	wantTemplates := map[string]bool{}
	for i := range 30 {
		id := fmt.Sprintf("big-%d", i)
		if _, err := templates.CreateTemplate(t.Context(), connect.NewRequest(&ctrlv1.CreateTemplateRequest{
			Command: cmd(), TemplateId: id, Annotations: map[string]string{"big": big}})); err != nil {
			t.Fatal(err)
		}
		wantTemplates[id] = true
	}
	seen, pages := map[string]int{}, 0
	for token := ""; ; {
		resp, err := templates.ListTemplates(t.Context(), connect.NewRequest(&ctrlv1.ListTemplatesRequest{PageSize: 1000, PageToken: token}))
		if err != nil {
			t.Fatal(err)
		}
		pages++
		size := 0
		for _, tpl := range resp.Msg.GetTemplates() {
			seen[tpl.GetTemplateId()]++
			size += len(tpl.GetAnnotations()["big"])
		}
		if size > resource.PageBytes+len(big) {
			t.Errorf("templates page %d carries %d bytes of annotations, more than %d and one template", pages, size, resource.PageBytes)
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			break
		}
	}
	for id := range wantTemplates {
		if seen[id] != 1 {
			t.Errorf("template %s listed %d times, want once", id, seen[id])
		}
	}
	if pages < 2 {
		t.Errorf("30 templates of 200 KiB came in %d page, want the bound to cut them", pages)
	}
}

// TestRefusalsNameWhatWasSent: a refusal names the field and the value the
// caller sent, and the same request is refused with the same words.
func TestRefusalsNameWhatWasSent(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		wsc := e.workspaces()
		create := func(spec *ctrlv1.WorkspaceCreateSpec) error {
			spec.Resources = &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20}
			_, err := wsc.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(), Spec: spec}))
			return err
		}
		wantRefusal := func(what string, err error, want string) {
			t.Helper()
			if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want invalid_argument saying %q", what, err, want)
			}
		}

		err := create(&ctrlv1.WorkspaceCreateSpec{Volume: &ctrlv1.WorkspaceVolumeBinding{MountPath: "/.."}})
		wantRefusal("mount path /..", err, `"/.." is "/" once cleaned`)

		for _, deadline := range []*timestamppb.Timestamp{{Seconds: 253402300800}, {Seconds: 4102444800, Nanos: -1}} {
			err := create(&ctrlv1.WorkspaceCreateSpec{Expiration: &ctrlv1.WorkspaceExpirationPolicy{Deadline: deadline,
				Action: ctrlv1.WorkspaceExpirationAction_WORKSPACE_EXPIRATION_ACTION_STOP}})
			wantRefusal(fmt.Sprintf("deadline %v", deadline), err, "is not a valid timestamp")
		}

		twoBadLists := &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET,
			Allow: []string{"10.0.0.1/8"}, Deny: []string{"10.1.0.1/8"}}
		for range 20 {
			wantRefusal("a policy with two bad lists", create(&ctrlv1.WorkspaceCreateSpec{NetworkPolicy: twoBadLists}), "network_policy.allow[0]")
		}
	})
}
