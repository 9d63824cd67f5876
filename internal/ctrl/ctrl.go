// Package ctrl serves the kibotos.ctrl.v1 API over Connect: thin handlers
// that turn requests into calls of the services beneath (objects,
// command) and their results into responses. No SQL and no rule lives here.
package ctrl

import (
	"errors"
	"log/slog"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/objects"
	"github.com/kibotos/kibotos/internal/pagetoken"
	"github.com/kibotos/kibotos/internal/store"
)

// Deps is what the handlers need.
type Deps struct {
	Store   store.Store
	Pages   *pagetoken.Codec
	Checker *netcheck.Checker
}

// NewEgressService returns the EgressService handler.
func NewEgressService(d Deps) *EgressService {
	return &EgressService{objects: &objects.Service[*ctrlv1.EgressSpec]{Kind: egressKind(d.Checker), Store: d.Store, Pages: d.Pages}}
}

// NewResolverService returns the ResolverService handler.
func NewResolverService(d Deps) *ResolverService {
	return &ResolverService{objects: &objects.Service[*ctrlv1.ResolverSpec]{Kind: resolverKind(), Store: d.Store, Pages: d.Pages}}
}

// mutation describes a write request to the objects package: the whole
// request message is the command's input.
func mutation[R proto.Message, Q any, PQ interface {
	*Q
	proto.Message
}](req *connect.Request[Q], cmd *ctrlv1.CommandMetadata) objects.Mutation[R] {
	return objects.Mutation[R]{
		Method:  req.Spec().Procedure,
		Command: cmd,
		Input:   PQ(req.Msg),
		New:     func() R { return newMessage[R]() },
	}
}

func newMessage[R proto.Message]() R {
	var zero R
	return zero.ProtoReflect().Type().New().Interface().(R)
}

// respond wraps a result, passing canonical errors through and reporting
// any other error as internal without its text (which may name database
// details).
func respond[R any](msg *R, err error) (*connect.Response[R], error) {
	if err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		slog.Error("internal error", "err", err)
		return nil, connect.NewError(connect.CodeInternal, errors.New("internal error; see the server log"))
	}
	return connect.NewResponse(msg), nil
}
