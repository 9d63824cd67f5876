package cli

import (
	"context"
	"errors"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

type egressClient = ctrlv1connect.EgressServiceClient

func egressCommand() *cobra.Command {
	return egresses.command("Manage Egresses: SOCKS5 endpoints that carry part of a workspace's traffic")
}

var egressTable = table[*ctrlv1.Egress]{
	header: []string{"ID", "ADDRESS", "TLS", "UDP", "REVISION", "LABELS", "AGE"},
	row: func(e *ctrlv1.Egress) []string {
		s := e.GetSpec()
		return []string{
			e.GetEgressId(),
			orDash(s.GetSocks5().GetAddress()),
			boolean(s.GetSocks5().GetTls() != nil),
			boolean(s.GetUdpEnabled()),
			decimal(e.GetRevision()),
			pairs(e.GetLabels()),
			age(e.GetCreatedAt()),
		}
	},
}

// egressFlags describe an EgressSpec.
type egressFlags struct {
	address, username, passwordFile string
	passwordStdin                   bool
	tls                             bool
	serverName, caCertFile          string
	udp                             bool
}

func (f *egressFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.address, "address", "", "SOCKS5 endpoint, host:port (required)")
	fl.StringVar(&f.username, "username", "", "SOCKS5 username")
	fl.StringVar(&f.passwordFile, "password-file", "", "read the SOCKS5 password from this file (one trailing newline is stripped)")
	fl.BoolVar(&f.passwordStdin, "password-stdin", false, "read the SOCKS5 password from stdin (one trailing newline is stripped)")
	fl.BoolVar(&f.tls, "tls", false, "connect to the endpoint over TLS (implied by --server-name and --ca-cert)")
	fl.StringVar(&f.serverName, "server-name", "", "TLS server name to send and verify (default: the host of --address)")
	fl.StringVar(&f.caCertFile, "ca-cert", "", "PEM file of the CAs to trust instead of the system roots")
	fl.BoolVar(&f.udp, "udp", false, "let policies send udp Resolver queries through this Egress (the datagrams are not protected by TLS)")
	_ = cmd.MarkFlagRequired("address")
	cmd.MarkFlagsMutuallyExclusive("password-file", "password-stdin")
}

func (f *egressFlags) spec(cmd *cobra.Command) (*ctrlv1.EgressSpec, error) {
	if f.username == "" && (f.passwordFile != "" || f.passwordStdin) {
		return nil, errors.New("a password needs --username")
	}
	password, err := readSecret(cmd, f.passwordFile, f.passwordStdin)
	if err != nil {
		return nil, err
	}
	socks := &ctrlv1.Socks5Egress{Address: f.address, Username: f.username, Password: password}
	if f.tls || f.serverName != "" || f.caCertFile != "" {
		ca, err := readPEM(f.caCertFile)
		if err != nil {
			return nil, err
		}
		socks.Tls = &ctrlv1.EgressTls{ServerName: f.serverName, CaCert: ca}
	}
	return &ctrlv1.EgressSpec{
		Protocol:   &ctrlv1.EgressSpec_Socks5{Socks5: socks},
		UdpEnabled: f.udp,
	}, nil
}

var egresses = kind[egressClient, *ctrlv1.EgressSpec, *ctrlv1.Egress]{
	name:   "egress",
	plural: "egresses",
	specUse: "--address HOST:PORT [--username U (--password-file FILE | --password-stdin)] " +
		"[--tls] [--server-name N] [--ca-cert FILE] [--udp]",
	newClient:    ctrlv1connect.NewEgressServiceClient,
	newSpecFlags: func() specFlags[*ctrlv1.EgressSpec] { return new(egressFlags) },
	table:        egressTable,
	revision:     (*ctrlv1.Egress).GetRevision,

	create: func(ctx context.Context, cl egressClient, cmd *ctrlv1.CommandMetadata, spec *ctrlv1.EgressSpec, labels, annotations map[string]string) (proto.Message, *ctrlv1.Egress, error) {
		return carrying(ctx, cl.CreateEgress, &ctrlv1.CreateEgressRequest{Command: cmd, Spec: spec, Labels: labels, Annotations: annotations}, (*ctrlv1.CreateEgressResponse).GetEgress)
	},
	get: func(ctx context.Context, cl egressClient, id string) (proto.Message, *ctrlv1.Egress, error) {
		return carrying(ctx, cl.GetEgress, &ctrlv1.GetEgressRequest{EgressId: id}, (*ctrlv1.GetEgressResponse).GetEgress)
	},
	list: func(ctx context.Context, cl egressClient, q listQuery) ([]*ctrlv1.Egress, string, error) {
		return listed(ctx, cl.ListEgresses, &ctrlv1.ListEgressesRequest{PageSize: q.pageSize, PageToken: q.pageToken, LabelSelector: q.selector}, (*ctrlv1.ListEgressesResponse).GetEgresses)
	},
	listResponse: func(items []*ctrlv1.Egress, next string) proto.Message {
		return &ctrlv1.ListEgressesResponse{Egresses: items, NextPageToken: next}
	},
	update: func(ctx context.Context, cl egressClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, spec *ctrlv1.EgressSpec, drain *uint32) (proto.Message, *ctrlv1.Egress, error) {
		return carrying(ctx, cl.UpdateEgress, &ctrlv1.UpdateEgressRequest{Command: cmd, EgressId: id, ExpectedRevision: expected, Spec: spec, DrainSeconds: drain}, (*ctrlv1.UpdateEgressResponse).GetEgress)
	},
	del: func(ctx context.Context, cl egressClient, cmd *ctrlv1.CommandMetadata, id string) (proto.Message, error) {
		return call(ctx, cl.DeleteEgress, &ctrlv1.DeleteEgressRequest{Command: cmd, EgressId: id})
	},
	labels: labelField((*ctrlv1.Egress).GetLabelsRevision, func(ctx context.Context, cl egressClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Egress, error) {
		return carrying(ctx, cl.UpdateEgressLabels, &ctrlv1.UpdateEgressLabelsRequest{Command: cmd, EgressId: id, ExpectedLabelsRevision: expected, Labels: m}, (*ctrlv1.UpdateEgressLabelsResponse).GetEgress)
	}),
	annotations: annotationField((*ctrlv1.Egress).GetAnnotationsRevision, func(ctx context.Context, cl egressClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Egress, error) {
		return carrying(ctx, cl.UpdateEgressAnnotations, &ctrlv1.UpdateEgressAnnotationsRequest{Command: cmd, EgressId: id, ExpectedAnnotationsRevision: expected, Annotations: m}, (*ctrlv1.UpdateEgressAnnotationsResponse).GetEgress)
	}),
}
