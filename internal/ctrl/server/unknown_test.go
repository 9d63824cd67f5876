package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// TestFieldsTheSchemaLacks: in JSON, a field or an enum name the schema
// does not define is refused and changes nothing; in the binary protocol,
// a field the schema does not define is dropped, never stored, returned or
// taken for a change.
func TestFieldsTheSchemaLacks(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		wsc := e.workspaces()

		refused := []struct{ what, procedure, body, want string }{
			{"a misspelled field", "/kibotos.ctrl.v1.EgressService/CreateEgress",
				`{"command":{"commandId":"json-1"},"spec":{"socks5":{"address":"93.184.216.34:1080","adress":"x"}}}`,
				`unknown field \"adress\"`},
			{"an enum name the API does not define", "/kibotos.ctrl.v1.WorkspaceService/CreateWorkspace",
				`{"command":{"commandId":"json-2"},"spec":{"resources":{"memoryBytes":"134217728"},"volume":{"mode":"FOO"}}}`,
				`\"FOO\"`},
		}
		for _, r := range refused {
			status, body := e.post(r.procedure, "application/json", []byte(r.body))
			if status != http.StatusBadRequest || !strings.Contains(string(body), `"invalid_argument"`) || !strings.Contains(string(body), r.want) {
				t.Errorf("%s: %d %s, want invalid_argument naming %s", r.what, status, body, r.want)
			}
		}
		if n := e.countEgresses(); n != 0 {
			t.Errorf("%d egresses after a refused create, want none", n)
		}
		list := must[*connect.Response[ctrlv1.ListWorkspacesResponse]](t, "list workspaces")(
			wsc.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{})))
		if n := len(list.Msg.Workspaces); n != 0 {
			t.Errorf("%d workspaces after a refused create, want none", n)
		}

		smuggled := func(m proto.Message) {
			b := protowire.AppendTag(nil, 99, protowire.BytesType)
			m.ProtoReflect().SetUnknown(protowire.AppendString(b, "caller-smuggled"))
		}
		spec := socks5("93.184.216.34:1080")
		smuggled(spec)
		smuggled(spec.GetSocks5())
		created := must[*connect.Response[ctrlv1.CreateEgressResponse]](t, "create with unknown fields")(
			e.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: cmd(), Spec: spec})))
		got := must[*connect.Response[ctrlv1.GetEgressResponse]](t, "get")(
			e.egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: created.Msg.Egress.EgressId})))
		if n := len(got.Msg.Egress.Spec.ProtoReflect().GetUnknown()) + len(got.Msg.Egress.Spec.GetSocks5().ProtoReflect().GetUnknown()); n != 0 {
			t.Errorf("the stored spec keeps %d bytes the schema does not define", n)
		}

		same := socks5("93.184.216.34:1080")
		smuggled(same.GetSocks5())
		updated := must[*connect.Response[ctrlv1.UpdateEgressResponse]](t, "update of equal content")(
			e.egress.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{Command: cmd(),
				EgressId: created.Msg.Egress.EgressId, ExpectedRevision: 1, Spec: same})))
		if rev := updated.Msg.Egress.Revision; rev != 1 {
			t.Errorf("an update equal but for an unknown field moved the revision to %d, want 1", rev)
		}

		first := &ctrlv1.CreateEgressRequest{Command: cmd(), Spec: socks5("93.184.216.34:1081")}
		again := proto.CloneOf(first)
		smuggled(again)
		answer := must[*connect.Response[ctrlv1.CreateEgressResponse]](t, "create")(e.egress.CreateEgress(ctx, connect.NewRequest(first)))
		replay := must[*connect.Response[ctrlv1.CreateEgressResponse]](t, "the same command with an unknown field")(
			e.egress.CreateEgress(ctx, connect.NewRequest(again)))
		if !proto.Equal(answer.Msg, replay.Msg) {
			t.Errorf("replay differs: %v, first %v", replay.Msg, answer.Msg)
		}
	})
}
