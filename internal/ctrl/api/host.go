package api

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/transfers"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// assignmentsPoll bounds how long a host stream can miss a change made by
// another ctrl replica.
const assignmentsPoll = 2 * time.Second

// blobChunk is the size of one GetTemplateBlob message.
const blobChunk = 1 << 20

// Blobs opens template blobs by digest.
type Blobs interface {
	Blob(ctx context.Context, digest string) (io.ReadCloser, int64, error)
}

// HostService serves kibotos.host.v1.HostService to host agents. It is
// authenticated by the deployment's host token, not by project tokens.
type HostService struct {
	hostv1connect.UnimplementedHostServiceHandler
	svc   *workspaces.Service
	blobs Blobs
	// transfers is nil in a deployment without a blob store.
	transfers *transfers.Service
}

// NewHostService returns the HostService handler; transfers may be nil.
func NewHostService(svc *workspaces.Service, blobs Blobs, transfers *transfers.Service) *HostService {
	return &HostService{svc: svc, blobs: blobs, transfers: transfers}
}

// HostAuth is the interceptor of HostService: every call must carry the
// deployment's own host token (that of the host agent `kibotos up` embeds)
// or a host token an operator issued and has not revoked. Its Check is
// that test alone, for auth.Gate.
func HostAuth(token string, st store.Store) HostAuthenticator {
	check := func(ctx context.Context, header string) (string, error) {
		got, ok := bearer.Parse(header)
		if ok && token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			return auth.DeploymentHostToken, nil
		}
		id, err := "", auth.ErrUnauthenticated
		if ok {
			id, err = auth.AuthenticateHost(ctx, st, got)
		}
		switch {
		case errors.Is(err, auth.ErrUnauthenticated):
			return "", connect.NewError(connect.CodeUnauthenticated, errors.New("a valid host token is required"))
		case err != nil:
			_, err = Respond(&struct{}{}, err)
			return "", err
		}
		return id, nil
	}
	return HostAuthenticator{check: check}
}

// HostAuthenticator authenticates host API calls; a call's context
// carries the ID of its host token (auth.WithHostToken), which the host
// IDs it names must belong to (workspaces.CheckRegistered).
type HostAuthenticator struct {
	check func(context.Context, string) (string, error)
}

// Check authenticates the host token of an Authorization header, for any
// procedure of the host API: the Gate's key of the token, or the refusal a
// call gets.
func (h HostAuthenticator) Check(ctx context.Context, _, header string) (string, error) {
	id, err := h.check(ctx, header)
	return auth.HostCallerPrefix + id, err
}

func (h HostAuthenticator) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if !req.Spec().IsClient {
			id, err := h.check(ctx, req.Header().Get("Authorization"))
			if err != nil {
				return nil, err
			}
			ctx = auth.WithHostToken(ctx, id)
		}
		return next(ctx, req)
	}
}

func (h HostAuthenticator) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler checks the token at the start of a stream and
// again every assignmentsPoll while it lasts, so that a revoked token
// also ends the streams it opened (WatchAssignments runs for as long as
// the host does).
func (h HostAuthenticator) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		header := conn.RequestHeader().Get("Authorization")
		id, err := h.check(ctx, header)
		if err != nil {
			return err
		}
		return auth.WhileAuthenticated(auth.WithHostToken(ctx, id), assignmentsPoll, func(ctx context.Context) error {
			_, err := h.check(ctx, header)
			return err
		}, func(ctx context.Context) error { return next(ctx, conn) })
	}
}

func (s *HostService) RegisterHost(ctx context.Context, req *connect.Request[hostv1.RegisterHostRequest]) (*connect.Response[hostv1.RegisterHostResponse], error) {
	return Respond(&hostv1.RegisterHostResponse{ReportInterval: durationpb.New(workspaces.ReportInterval(s.svc.Lease())),
		HostLease: durationpb.New(s.svc.Lease())},
		s.svc.RegisterHost(ctx, req.Msg))
}

// WatchAssignments sends the host's complete desired set now and after
// every change, until another agent registers the host.
func (s *HostService) WatchAssignments(ctx context.Context, req *connect.Request[hostv1.WatchAssignmentsRequest], stream *connect.ServerStream[hostv1.WatchAssignmentsResponse]) error {
	if err := s.svc.CheckAgent(ctx, req.Msg.GetHostId(), req.Msg.GetStateId()); err != nil {
		_, err = Respond[hostv1.WatchAssignmentsResponse](nil, err)
		return err
	}
	ctx, shutDown, cancel := untilShutdown(ctx)
	defer cancel()
	var (
		last    *hostv1.WatchAssignmentsResponse
		version uint64
	)
	for {
		changed := s.svc.Changes.Changed()
		if err := s.svc.CheckAgent(ctx, req.Msg.GetHostId(), req.Msg.GetStateId()); err != nil {
			_, err = Respond(last, shutDown(err))
			return err
		}
		msg, err := s.svc.Assignments(ctx, req.Msg.GetHostId())
		if err == nil && s.transfers != nil {
			msg.Transfers, err = s.transfers.HostAssignments(ctx, req.Msg.GetHostId())
		}
		if err != nil {
			_, err = Respond(last, shutDown(err))
			return err
		}
		if last == nil || !proto.Equal(&hostv1.WatchAssignmentsResponse{Assignments: last.Assignments, Volumes: last.Volumes, Transfers: last.Transfers}, msg) {
			version++
			msg.Version = version
			if err := stream.Send(msg); err != nil {
				return err
			}
			last = msg
		}
		select {
		case <-ctx.Done():
			_, err := Respond[hostv1.WatchAssignmentsResponse](nil, shutDown(nil))
			return err
		case <-changed:
		case <-time.After(assignmentsPoll):
		}
	}
}

// ReportExecutions folds what a host observed into the workspaces,
// Volumes and Transfers it works on; a report it could not have made
// refuses the whole call, before anything is stored.
func (s *HostService) ReportExecutions(ctx context.Context, req *connect.Request[hostv1.ReportExecutionsRequest]) (*connect.Response[hostv1.ReportExecutionsResponse], error) {
	if err := workspaces.CheckReports(req.Msg.GetReports(), req.Msg.GetVolumes()); err != nil {
		return Respond[hostv1.ReportExecutionsResponse](nil, err)
	}
	if err := transfers.CheckReports(req.Msg.GetTransfers()); err != nil {
		return Respond[hostv1.ReportExecutionsResponse](nil, err)
	}
	if err := s.svc.CheckAgent(ctx, req.Msg.GetHostId(), req.Msg.GetStateId()); err != nil {
		return Respond[hostv1.ReportExecutionsResponse](nil, err)
	}
	if s.transfers != nil {
		s.transfers.Report(ctx, req.Msg.GetHostId(), req.Msg.GetTransfers())
	}
	return Respond(&hostv1.ReportExecutionsResponse{}, s.svc.Report(ctx, req.Msg.GetHostId(), req.Msg.GetReports(), req.Msg.GetVolumes()))
}

// PutTransferArtifact receives the artifact of an export the host ran.
func (s *HostService) PutTransferArtifact(ctx context.Context, stream *connect.ClientStream[hostv1.PutTransferArtifactRequest]) (*connect.Response[hostv1.PutTransferArtifactResponse], error) {
	if s.transfers == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this deployment keeps no transfers"))
	}
	// The first message names the host: it must be the caller's.
	recv := receiver(stream)
	first, err := recv()
	if err == nil {
		if err := s.svc.CheckRegistered(ctx, first.GetHostId()); err != nil {
			return Respond[hostv1.PutTransferArtifactResponse](nil, err)
		}
	}
	replayed := false
	return Respond(&hostv1.PutTransferArtifactResponse{}, s.transfers.PutArtifact(ctx, func() (*hostv1.PutTransferArtifactRequest, error) {
		if !replayed {
			replayed = true
			return first, err
		}
		return recv()
	}))
}

// GetTransferArtifact streams an artifact to a host assigned to restore
// from it.
func (s *HostService) GetTransferArtifact(ctx context.Context, req *connect.Request[hostv1.GetTransferArtifactRequest], stream *connect.ServerStream[hostv1.GetTransferArtifactResponse]) error {
	if s.transfers == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this deployment keeps no transfers"))
	}
	if err := s.svc.CheckRestoring(ctx, req.Msg.GetHostId(), req.Msg.GetTransferId()); err != nil {
		_, err = Respond[hostv1.GetTransferArtifactResponse](nil, err)
		return err
	}
	err := s.transfers.OpenArtifact(ctx, req.Msg.GetTransferId(), req.Msg.GetOffset(), func(data []byte, total uint64) error {
		return stream.Send(&hostv1.GetTransferArtifactResponse{Data: data, TotalBytes: total})
	})
	_, err = Respond[hostv1.GetTransferArtifactResponse](nil, err)
	return err
}

// CollectableLayers names the writable layers a host keeps that no
// workspace will use again.
func (s *HostService) CollectableLayers(ctx context.Context, req *connect.Request[hostv1.CollectableLayersRequest]) (*connect.Response[hostv1.CollectableLayersResponse], error) {
	ids, err := s.svc.CollectableLayers(ctx, req.Msg.GetHostId(), req.Msg.GetLayerIds())
	return Respond(&hostv1.CollectableLayersResponse{LayerIds: ids}, err)
}

// GetTemplateBlob streams a template blob to a host that needs it: a
// layer of the template of an execution assigned to it, or a blob an
// export assigned to it carries. Any other digest is not_found, whether
// stored or not: a blob of another tenant's private template is not even
// known to exist.
func (s *HostService) GetTemplateBlob(ctx context.Context, req *connect.Request[hostv1.GetTemplateBlobRequest], stream *connect.ServerStream[hostv1.GetTemplateBlobResponse]) error {
	hostID, digest := req.Msg.GetHostId(), req.Msg.GetDigest()
	if err := s.svc.CheckRegistered(ctx, hostID); err != nil {
		_, err = Respond[hostv1.GetTemplateBlobResponse](nil, err)
		return err
	}
	needed, err := s.svc.AssignsBlob(ctx, hostID, digest)
	if err == nil && !needed && s.transfers != nil {
		needed, err = s.transfers.ExportsBlob(ctx, hostID, digest)
	}
	if err != nil {
		_, err = Respond[hostv1.GetTemplateBlobResponse](nil, err)
		return err
	}
	if !needed {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("blob %s: no assignment of host %s names it", digest, hostID))
	}
	r, size, err := s.blobs.Blob(ctx, digest)
	if err != nil {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("blob %s: %w", digest, err))
	}
	defer r.Close()
	off := req.Msg.GetOffset()
	if off > uint64(size) {
		return connect.NewError(connect.CodeOutOfRange, fmt.Errorf("offset %d is past the blob's %d bytes", off, size))
	}
	if _, err := io.CopyN(io.Discard, r, int64(off)); err != nil {
		return err
	}
	buf := make([]byte, blobChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if serr := stream.Send(&hostv1.GetTemplateBlobResponse{Data: buf[:n], TotalBytes: uint64(size)}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
