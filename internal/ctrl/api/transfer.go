package api

import (
	"context"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/transfers"
)

// TransferService serves kibotos.ctrl.v1.TransferService.
type TransferService struct {
	ctrlv1connect.UnimplementedTransferServiceHandler
	svc *transfers.Service
}

// NewTransferService returns the TransferService handler.
func NewTransferService(svc *transfers.Service) *TransferService { return &TransferService{svc: svc} }

func (s *TransferService) ExportWorkspace(ctx context.Context, req *connect.Request[ctrlv1.ExportWorkspaceRequest]) (*connect.Response[ctrlv1.ExportWorkspaceResponse], error) {
	m := req.Msg
	return Respond(transfers.Export(ctx, s.svc, Mutation[*ctrlv1.ExportWorkspaceResponse](req, m.GetCommand()),
		m.GetWorkspaceId(), m.GetLabels(), m.GetAnnotations(), m.GetWithTemplate(),
		func(t *ctrlv1.Transfer) *ctrlv1.ExportWorkspaceResponse {
			return &ctrlv1.ExportWorkspaceResponse{Transfer: t}
		}))
}

func (s *TransferService) ReadTransferArtifact(ctx context.Context, req *connect.Request[ctrlv1.ReadTransferArtifactRequest], stream *connect.ServerStream[ctrlv1.ReadTransferArtifactResponse]) error {
	err := s.svc.Read(ctx, req.Msg.GetTransferId(), req.Msg.GetOffset(), func(data []byte, total uint64) error {
		return stream.Send(&ctrlv1.ReadTransferArtifactResponse{Data: data, TotalBytes: total})
	})
	_, err = Respond[ctrlv1.ReadTransferArtifactResponse](nil, err)
	return err
}

func (s *TransferService) ImportTransfer(ctx context.Context, stream *connect.ClientStream[ctrlv1.ImportTransferRequest]) (*connect.Response[ctrlv1.ImportTransferResponse], error) {
	return Respond(s.svc.Import(ctx, receiver(stream)))
}

func (s *TransferService) RestoreWorkspace(ctx context.Context, req *connect.Request[ctrlv1.RestoreWorkspaceRequest]) (*connect.Response[ctrlv1.RestoreWorkspaceResponse], error) {
	m := req.Msg
	return Respond(transfers.Restore(ctx, s.svc, Mutation[*ctrlv1.RestoreWorkspaceResponse](req, m.GetCommand()),
		m.GetTransferId(), m.GetLabels(), m.GetAnnotations(),
		func(ws *ctrlv1.Workspace, t *ctrlv1.Transfer) *ctrlv1.RestoreWorkspaceResponse {
			return &ctrlv1.RestoreWorkspaceResponse{Workspace: ws, Transfer: t}
		}))
}

func (s *TransferService) GetTransfer(ctx context.Context, req *connect.Request[ctrlv1.GetTransferRequest]) (*connect.Response[ctrlv1.GetTransferResponse], error) {
	t, err := s.svc.Get(ctx, req.Msg.GetTransferId())
	return Respond(&ctrlv1.GetTransferResponse{Transfer: t}, err)
}

func (s *TransferService) ListTransfers(ctx context.Context, req *connect.Request[ctrlv1.ListTransfersRequest]) (*connect.Response[ctrlv1.ListTransfersResponse], error) {
	m := req.Msg
	list, next, err := s.svc.List(ctx, m.GetPageSize(), m.GetPageToken(), m.GetLabelSelector())
	return Respond(&ctrlv1.ListTransfersResponse{Transfers: list, NextPageToken: next}, err)
}

func (s *TransferService) DeleteTransfer(ctx context.Context, req *connect.Request[ctrlv1.DeleteTransferRequest]) (*connect.Response[ctrlv1.DeleteTransferResponse], error) {
	m := req.Msg
	return Respond(transfers.Delete(ctx, s.svc, Mutation[*ctrlv1.DeleteTransferResponse](req, m.GetCommand()), m.GetTransferId(),
		func(t *ctrlv1.Transfer) *ctrlv1.DeleteTransferResponse {
			return &ctrlv1.DeleteTransferResponse{Transfer: t}
		}))
}
