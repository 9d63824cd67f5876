package server_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/command"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/testutil"
)

// post sends one Connect unary call as raw bytes and returns the status
// and body, so that tests compare exactly what went over the wire.
func (e *env) post(procedure, contentType string, body []byte) (int, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+procedure, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Authorization", "Bearer "+e.admin)
	resp, out := testutil.Do(e.t, e.http, req)
	return resp.StatusCode, out
}

func TestReplayReturnsIdenticalResponse(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		const create = "/kibotos.ctrl.v1.EgressService/CreateEgress"
		body := `{"command":{"commandId":"replay-json"},"spec":{"socks5":{"address":"93.184.216.34:1080"}},` +
			`"labels":{"b":"2","a":"1","c":"3"},"annotations":{"z":"last","m":"middle"}}`
		status, first := e.post(create, "application/json", []byte(body))
		if status != http.StatusOK {
			t.Fatalf("create: %d %s", status, first)
		}
		for range 3 {
			if status, again := e.post(create, "application/json", []byte(body)); status != http.StatusOK || !bytes.Equal(again, first) {
				t.Fatalf("JSON replay differs:\nfirst %s\nagain %d %s", first, status, again)
			}
		}

		req := &ctrlv1.CreateEgressRequest{Command: &ctrlv1.CommandMetadata{CommandId: "replay-proto"},
			Spec: socks5("proxy.example.com:1080"), Labels: map[string]string{"x": "1", "y": "2", "w": "3"}}
		raw, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		status, firstProto := e.post(create, "application/proto", raw)
		if status != http.StatusOK {
			t.Fatalf("proto create: %d %q", status, firstProto)
		}
		for range 3 {
			if _, again := e.post(create, "application/proto", raw); !bytes.Equal(again, firstProto) {
				t.Fatal("binary replay differs from the first response")
			}
		}
		if n := e.countEgresses(); n != 2 {
			t.Errorf("egresses stored = %d, want 2 (replays must not create)", n)
		}

		// A replayed update returns its first response even after later changes.
		eg := e.createEgress(socks5("93.184.216.34:1080"), nil)
		update := &ctrlv1.UpdateEgressRequest{Command: cmd(), EgressId: eg.EgressId, ExpectedRevision: 1, Spec: socks5("93.184.216.34:1081")}
		first1, err := e.egress.UpdateEgress(context.Background(), connect.NewRequest(update))
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.egress.UpdateEgress(context.Background(), connect.NewRequest(&ctrlv1.UpdateEgressRequest{
			Command: cmd(), EgressId: eg.EgressId, ExpectedRevision: 2, Spec: socks5("93.184.216.34:1082")}))
		if err != nil {
			t.Fatal(err)
		}
		replayed, err := e.egress.UpdateEgress(context.Background(), connect.NewRequest(update))
		if err != nil {
			t.Fatalf("replay of an update whose revision is stale: %v", err)
		}
		if !proto.Equal(replayed.Msg, first1.Msg) {
			t.Errorf("replayed update = %v, want the first response %v", replayed.Msg, first1.Msg)
		}
	})
}

func TestConflictingCommandReuse(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		id := &ctrlv1.CommandMetadata{CommandId: "reused"}
		first, err := e.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: id, Spec: socks5("93.184.216.34:1080")}))
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: id, Spec: socks5("93.184.216.34:1081")}))
		wantCode(t, "same command_id, other address", err, connect.CodeAlreadyExists)
		_, err = e.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: id,
			Spec: socks5("93.184.216.34:1080"), Labels: map[string]string{"a": "b"}}))
		wantCode(t, "same command_id, labels added", err, connect.CodeAlreadyExists)
		_, err = e.egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{Command: id,
			EgressId: first.Msg.Egress.EgressId, ExpectedLabelsRevision: 1, Labels: map[string]string{"a": "b"}}))
		wantCode(t, "same command_id on another method", err, connect.CodeAlreadyExists)
		_, err = e.resolver.CreateResolver(ctx, connect.NewRequest(&ctrlv1.CreateResolverRequest{Command: id,
			Spec: &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "9.9.9.9:53"}}}}))
		wantCode(t, "same command_id on another service", err, connect.CodeAlreadyExists)

		got, err := e.egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: first.Msg.Egress.EgressId}))
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got.Msg.Egress, first.Msg.Egress) {
			t.Errorf("egress changed by refused commands: %v", got.Msg.Egress)
		}
		if n := e.countEgresses(); n != 1 {
			t.Errorf("egresses = %d, want 1", n)
		}

		// Another project using the same command_id runs its own command.
		_, token := e.project("other", adminv1.Role_ROLE_EDITOR)
		other, _, _ := e.clients(token)
		if _, err := other.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: id, Spec: socks5("93.184.216.34:1081")})); err != nil {
			t.Errorf("same command_id in another project: %v", err)
		}
	})
}

// TestCompareAndSwapRace sends 50 concurrent updates that all observed
// revision 1: exactly one wins, the rest are aborted, nothing is lost.
func TestCompareAndSwapRace(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		eg := e.createEgress(socks5("93.184.216.34:1080"), nil)
		const n = 50
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				_, errs[i] = e.egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{
					Command: cmd(), EgressId: eg.EgressId, ExpectedRevision: 1,
					Spec: socks5(fmt.Sprintf("93.184.216.34:%d", 2000+i))}))
			})
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			if err == nil {
				if winner >= 0 {
					t.Errorf("updates %d and %d both won", winner, i)
				}
				winner = i
				continue
			}
			if connect.CodeOf(err) != connect.CodeAborted {
				t.Errorf("update %d: %v, want aborted", i, err)
			}
		}
		if winner < 0 {
			t.Fatal("no update won")
		}
		got, err := e.egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: eg.EgressId}))
		if err != nil {
			t.Fatal(err)
		}
		if got.Msg.Egress.Revision != 2 || got.Msg.Egress.Spec.GetSocks5().Address != fmt.Sprintf("93.184.216.34:%d", 2000+winner) {
			t.Errorf("after the race: revision %d, address %s; want 2 and the winner's", got.Msg.Egress.Revision, got.Msg.Egress.Spec.GetSocks5().Address)
		}

		// Labels race the same way, independently of the spec revision.
		for i := range n {
			wg.Go(func() {
				_, errs[i] = e.egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{
					Command: cmd(), EgressId: eg.EgressId, ExpectedLabelsRevision: 1, Labels: label(i)}))
			})
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			if err == nil {
				wins++
			} else if connect.CodeOf(err) != connect.CodeAborted {
				t.Errorf("labels update: %v", err)
			}
		}
		if wins != 1 {
			t.Errorf("label updates won = %d, want 1", wins)
		}
	})
}

func TestRevisionsMoveOnlyOnChange(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		eg := e.createEgress(socks5("93.184.216.34:1080"), map[string]string{"a": "1"})
		if eg.Revision != 1 || eg.LabelsRevision != 1 || eg.AnnotationsRevision != 1 {
			t.Fatalf("new egress revisions = %d/%d/%d, want 1/1/1", eg.Revision, eg.LabelsRevision, eg.AnnotationsRevision)
		}
		update := func(rev uint64, spec *ctrlv1.EgressSpec) *ctrlv1.Egress {
			resp, err := e.egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{
				Command: cmd(), EgressId: eg.EgressId, ExpectedRevision: rev, Spec: spec}))
			if err != nil {
				t.Fatal(err)
			}
			return resp.Msg.Egress
		}
		if got := update(1, socks5("93.184.216.34:1080")); got.Revision != 1 || !got.UpdatedAt.AsTime().Equal(eg.UpdatedAt.AsTime()) {
			t.Errorf("equal content: revision %d, want 1 and updated_at unchanged", got.Revision)
		}
		spec := socks5("93.184.216.34:1080")
		spec.UdpEnabled = true
		if got := update(1, spec); got.Revision != 2 || !got.Spec.UdpEnabled || got.LabelsRevision != 1 {
			t.Errorf("udp_enabled change: %v", got)
		}
		_, err := e.egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{
			Command: cmd(), EgressId: eg.EgressId, ExpectedRevision: 1, Spec: socks5("93.184.216.34:1080")}))
		wantCode(t, "stale expected_revision", err, connect.CodeAborted)

		labels := func(rev uint64, l map[string]string) *ctrlv1.Egress {
			resp, err := e.egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{
				Command: cmd(), EgressId: eg.EgressId, ExpectedLabelsRevision: rev, Labels: l}))
			if err != nil {
				t.Fatal(err)
			}
			return resp.Msg.Egress
		}
		if got := labels(1, map[string]string{"a": "1"}); got.LabelsRevision != 1 {
			t.Errorf("equal labels moved labels_revision to %d", got.LabelsRevision)
		}
		if got := labels(1, nil); got.LabelsRevision != 2 || len(got.Labels) != 0 || got.Revision != 2 {
			t.Errorf("clearing labels: %v", got)
		}
		resp, err := e.egress.UpdateEgressAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateEgressAnnotationsRequest{
			Command: cmd(), EgressId: eg.EgressId, ExpectedAnnotationsRevision: 1, Annotations: map[string]string{"note": "any text ✓"}}))
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Msg.Egress; got.AnnotationsRevision != 2 || got.LabelsRevision != 2 || got.Annotations["note"] != "any text ✓" {
			t.Errorf("annotations update: %v", got)
		}
		_, err = e.egress.UpdateEgressAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateEgressAnnotationsRequest{
			Command: cmd(), EgressId: eg.EgressId, ExpectedAnnotationsRevision: 1}))
		wantCode(t, "stale expected_annotations_revision", err, connect.CodeAborted)
	})
}

// TestReferencedObjectsCannotBeDeleted uses the store's policy references,
// which the workspace service maintains, to check the refusals.
func TestReferencedObjectsCannotBeDeleted(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		udp := socks5("93.184.216.34:1080")
		udp.UdpEnabled = true
		eg := e.createEgress(udp, nil)
		rs := e.createResolver(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "10.0.0.53:53"}}})
		projectID := e.adminProject()
		refs := []store.PolicyReference{
			{Kind: store.RefEgress, TargetID: eg.EgressId},
			{Kind: store.RefEgressUDP, TargetID: eg.EgressId},
			{Kind: store.RefResolver, TargetID: rs.ResolverId},
		}
		if err := e.store.Update(ctx, func(tx store.Tx) error { return tx.SetPolicyReferences(ctx, projectID, "ws_test", refs) }); err != nil {
			t.Fatal(err)
		}
		_, err := e.egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Command: cmd(), EgressId: eg.EgressId}))
		wantCode(t, "delete referenced egress", err, connect.CodeFailedPrecondition)
		_, err = e.resolver.DeleteResolver(ctx, connect.NewRequest(&ctrlv1.DeleteResolverRequest{Command: cmd(), ResolverId: rs.ResolverId}))
		wantCode(t, "delete referenced resolver", err, connect.CodeFailedPrecondition)
		_, err = e.egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Command: cmd(), EgressId: eg.EgressId,
			ExpectedRevision: 1, Spec: socks5("93.184.216.34:1080")}))
		wantCode(t, "turn udp_enabled off under a udp resolver", err, connect.CodeFailedPrecondition)
		_, err = e.resolver.UpdateResolver(ctx, connect.NewRequest(&ctrlv1.UpdateResolverRequest{Command: cmd(), ResolverId: rs.ResolverId,
			ExpectedRevision: 1, Spec: &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: "10.0.0.53:53"}}}}))
		wantCode(t, "change the protocol of a referenced resolver", err, connect.CodeFailedPrecondition)
		if _, err := e.resolver.UpdateResolver(ctx, connect.NewRequest(&ctrlv1.UpdateResolverRequest{Command: cmd(), ResolverId: rs.ResolverId,
			ExpectedRevision: 1, Spec: &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "10.0.0.54:53"}}}})); err != nil {
			t.Errorf("change the address of a referenced resolver: %v", err)
		}
		still := must[*connect.Response[ctrlv1.GetEgressResponse]](t, "get")(e.egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: eg.EgressId})))
		if still.Msg.Egress.Revision != 1 || !still.Msg.Egress.Spec.UdpEnabled {
			t.Errorf("refused update changed the egress: %v", still.Msg.Egress)
		}

		// Without the udp path the Egress may drop udp; deleting the
		// workspace's references frees both.
		if err := e.store.Update(ctx, func(tx store.Tx) error { return tx.SetPolicyReferences(ctx, projectID, "ws_test", refs[:1]) }); err != nil {
			t.Fatal(err)
		}
		if _, err := e.egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Command: cmd(), EgressId: eg.EgressId,
			ExpectedRevision: 1, Spec: socks5("93.184.216.34:1080")})); err != nil {
			t.Errorf("udp off without a udp resolver: %v", err)
		}
		if err := e.store.Update(ctx, func(tx store.Tx) error { return tx.SetPolicyReferences(ctx, projectID, "ws_test", nil) }); err != nil {
			t.Fatal(err)
		}
		del := &ctrlv1.DeleteEgressRequest{Command: cmd(), EgressId: eg.EgressId}
		if _, err := e.egress.DeleteEgress(ctx, connect.NewRequest(del)); err != nil {
			t.Fatalf("delete unreferenced egress: %v", err)
		}
		if _, err := e.egress.DeleteEgress(ctx, connect.NewRequest(del)); err != nil {
			t.Errorf("replayed delete: %v", err)
		}
		if _, err := e.resolver.DeleteResolver(ctx, connect.NewRequest(&ctrlv1.DeleteResolverRequest{Command: cmd(), ResolverId: rs.ResolverId})); err != nil {
			t.Fatalf("delete unreferenced resolver: %v", err)
		}

		// Deleted is not_found to every read and every write.
		id := eg.EgressId
		_, err = e.egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: id}))
		wantCode(t, "get deleted", err, connect.CodeNotFound)
		_, err = e.egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Command: cmd(), EgressId: id, ExpectedRevision: 2, Spec: socks5("93.184.216.34:1080")}))
		wantCode(t, "update deleted", err, connect.CodeNotFound)
		_, err = e.egress.DeleteEgress(ctx, connect.NewRequest(&ctrlv1.DeleteEgressRequest{Command: cmd(), EgressId: id}))
		wantCode(t, "delete deleted with a new command", err, connect.CodeNotFound)
		_, err = e.egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{Command: cmd(), EgressId: id, ExpectedLabelsRevision: 1}))
		wantCode(t, "label deleted", err, connect.CodeNotFound)
		_, err = e.egress.UpdateEgressAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateEgressAnnotationsRequest{Command: cmd(), EgressId: id, ExpectedAnnotationsRevision: 1}))
		wantCode(t, "annotate deleted", err, connect.CodeNotFound)
		_, err = e.resolver.GetResolver(ctx, connect.NewRequest(&ctrlv1.GetResolverRequest{ResolverId: rs.ResolverId}))
		wantCode(t, "get deleted resolver", err, connect.CodeNotFound)
		if n := e.countEgresses(); n != 0 {
			t.Errorf("list shows %d egresses after delete", n)
		}
	})
}

// adminProject returns the project of the bootstrap admin token.
func (e *env) adminProject() string {
	e.t.Helper()
	resp, err := e.admins.ListTokens(context.Background(), connect.NewRequest(new(adminv1.ListTokensRequest)))
	if err != nil || len(resp.Msg.Tokens) == 0 {
		e.t.Fatalf("ListTokens: %v", err)
	}
	return resp.Msg.Tokens[0].ProjectId
}

// TestPrunedCommandRunsAgain prunes the records past the retention
// window: a command within it replays, and the same command_id after it is
// a new command.
func TestPrunedCommandRunsAgain(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		req := &ctrlv1.CreateEgressRequest{Command: cmd(), Spec: socks5("93.184.216.34:1080")}
		first, err := e.egress.CreateEgress(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		// Within the retention window nothing is pruned and a retry replays.
		if n, err := command.Prune(ctx, e.store, time.Now().Add(-command.DefaultRetention)); err != nil || n != 0 {
			t.Fatalf("prune within retention: %d, %v", n, err)
		}
		again, err := e.egress.CreateEgress(ctx, connect.NewRequest(req))
		if err != nil || again.Msg.Egress.EgressId != first.Msg.Egress.EgressId {
			t.Fatalf("replay within retention: %v, %v", again, err)
		}
		// Once the record is past retention it is pruned...
		if n, err := command.Prune(ctx, e.store, time.Now().Add(time.Second)); err != nil || n == 0 {
			t.Fatalf("prune past retention: %d, %v", n, err)
		}
		// ...and the same command_id creates a second Egress.
		later, err := e.egress.CreateEgress(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		if later.Msg.Egress.EgressId == first.Msg.Egress.EgressId {
			t.Error("a command after its record was pruned replayed")
		}
		if n := e.countEgresses(); n != 2 {
			t.Errorf("egresses = %d, want 2", n)
		}
	})
}
