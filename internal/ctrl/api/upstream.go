// What the Egress and Resolver handlers share: the two kinds have the same
// methods over the same upstreams functions, so each method's body stands
// here once, over the kind's spec (S), its API object (O), and the method's
// request (Q) and response (R) messages. The handlers name their kind's
// object ID and how a response carries the object.

package api

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/resource"
	"github.com/kibotos/kibotos/internal/ctrl/upstreams"
)

// upstreamKind is one kind's service and its conversion to the API object.
type upstreamKind[S proto.Message, O any] struct {
	objects *upstreams.Service[S]
	toAPI   func(upstreams.Object[S]) O
}

// message is the pointer type of message M.
type message[M any] interface {
	*M
	proto.Message
}

// commanded is a write request.
type commanded[M any] interface {
	message[M]
	GetCommand() *ctrlv1.CommandMetadata
}

// responder turns a stored object into the method's response.
func responder[S proto.Message, O any, PR proto.Message](k upstreamKind[S, O], wrap func(O) PR) func(upstreams.Object[S]) PR {
	return func(o upstreams.Object[S]) PR { return wrap(k.toAPI(o)) }
}

func createUpstream[S proto.Message, O, Q, R any, PQ interface {
	commanded[Q]
	GetSpec() S
	GetLabels() map[string]string
	GetAnnotations() map[string]string
}, PR message[R]](ctx context.Context, k upstreamKind[S, O], req *connect.Request[Q], wrap func(O) PR) (*connect.Response[R], error) {
	m := PQ(req.Msg)
	return Respond[R](upstreams.Create(ctx, k.objects, Mutation[PR, Q, PQ](req, m.GetCommand()),
		m.GetSpec(), m.GetLabels(), m.GetAnnotations(), responder(k, wrap)))
}

func getUpstream[S proto.Message, O, R any](ctx context.Context, k upstreamKind[S, O], id string, wrap func(O) *R) (*connect.Response[R], error) {
	o, err := k.objects.Get(ctx, id)
	return Respond(wrap(k.toAPI(o)), err)
}

func listUpstreams[S proto.Message, O, R any, PQ interface {
	*Q
	GetPageSize() uint32
	GetPageToken() string
	GetLabelSelector() map[string]string
}, Q any](ctx context.Context, k upstreamKind[S, O], req PQ, wrap func(objects []O, next string) *R) (*connect.Response[R], error) {
	page, err := k.objects.List(ctx, req.GetPageSize(), req.GetPageToken(), req.GetLabelSelector())
	var objects []O
	for _, o := range page.Objects {
		objects = append(objects, k.toAPI(o))
	}
	return Respond(wrap(objects, page.Next), err)
}

// updateUpstream takes drain, the request's optional drain_seconds, as its
// field: the getter cannot tell unset from zero.
func updateUpstream[S proto.Message, O, Q, R any, PQ interface {
	commanded[Q]
	GetExpectedRevision() uint64
	GetSpec() S
}, PR message[R]](ctx context.Context, k upstreamKind[S, O], req *connect.Request[Q], id string, drain *uint32, wrap func(O) PR) (*connect.Response[R], error) {
	m := PQ(req.Msg)
	return Respond[R](upstreams.Update(ctx, k.objects, Mutation[PR, Q, PQ](req, m.GetCommand()),
		id, m.GetExpectedRevision(), m.GetSpec(), drain, responder(k, wrap)))
}

func deleteUpstream[S proto.Message, O, Q, R any, PQ commanded[Q], PR message[R]](ctx context.Context, k upstreamKind[S, O], req *connect.Request[Q], id string, respond func() PR) (*connect.Response[R], error) {
	return Respond[R](upstreams.Delete(ctx, k.objects, Mutation[PR, Q, PQ](req, PQ(req.Msg).GetCommand()), id, respond))
}

// updateUpstreamMap replaces the labels or the annotations, field, of an
// object under their expected revision.
func updateUpstreamMap[S proto.Message, O, Q, R any, PQ commanded[Q], PR message[R]](ctx context.Context, k upstreamKind[S, O], req *connect.Request[Q],
	field resource.MapField, id string, expected uint64, value map[string]string, wrap func(O) PR) (*connect.Response[R], error) {
	return Respond[R](upstreams.UpdateMap(ctx, k.objects, Mutation[PR, Q, PQ](req, PQ(req.Msg).GetCommand()),
		field, id, expected, value, responder(k, wrap)))
}
