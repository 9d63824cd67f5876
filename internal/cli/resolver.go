package cli

import (
	"context"
	"errors"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
)

type resolverClient = ctrlv1connect.ResolverServiceClient

func resolverCommand() *cobra.Command {
	return resolvers.command("Manage Resolvers: DNS upstreams a workspace's policy can select")
}

var resolverTable = table[*ctrlv1.Resolver]{
	header: []string{"ID", "PROTOCOL", "UPSTREAM", "REVISION", "LABELS", "AGE"},
	row: func(r *ctrlv1.Resolver) []string {
		protocol, upstream := resolverUpstream(r.GetSpec())
		return []string{
			r.GetResolverId(),
			protocol,
			orDash(upstream),
			decimal(r.GetRevision()),
			pairs(r.GetLabels()),
			age(r.GetCreatedAt()),
		}
	},
}

// resolverUpstream returns the protocol of a spec and the address or URL it
// sends queries to.
func resolverUpstream(s *ctrlv1.ResolverSpec) (protocol, upstream string) {
	switch p := s.GetProtocol().(type) {
	case *ctrlv1.ResolverSpec_Udp:
		return "udp", p.Udp.GetAddress()
	case *ctrlv1.ResolverSpec_Tcp:
		return "tcp", p.Tcp.GetAddress()
	case *ctrlv1.ResolverSpec_Tls:
		return "tls", p.Tls.GetAddress()
	case *ctrlv1.ResolverSpec_Https:
		return "https", p.Https.GetUrl()
	}
	return "-", ""
}

// resolverFlags describe a ResolverSpec: exactly one protocol flag, plus the
// TLS settings of tls and https.
type resolverFlags struct {
	udp, tcp, tls, https   string
	serverName, caCertFile string
}

func (f *resolverFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.udp, "udp", "", "plain DNS over UDP to host:port")
	fl.StringVar(&f.tcp, "tcp", "", "plain DNS over TCP to host:port")
	fl.StringVar(&f.tls, "tls", "", "DNS over TLS to host:port")
	fl.StringVar(&f.https, "https", "", "DNS over HTTPS to this URL")
	fl.StringVar(&f.serverName, "server-name", "", "TLS server name to send and verify, for --tls and --https (default: the upstream's host)")
	fl.StringVar(&f.caCertFile, "ca-cert", "", "PEM file of the CAs to trust instead of the system roots, for --tls and --https")
	cmd.MarkFlagsOneRequired("udp", "tcp", "tls", "https")
	cmd.MarkFlagsMutuallyExclusive("udp", "tcp", "tls", "https")
}

func (f *resolverFlags) spec(*cobra.Command) (*ctrlv1.ResolverSpec, error) {
	if (f.udp != "" || f.tcp != "") && (f.serverName != "" || f.caCertFile != "") {
		return nil, errors.New("--server-name and --ca-cert apply only to --tls and --https")
	}
	ca, err := readPEM(f.caCertFile)
	if err != nil {
		return nil, err
	}
	var spec ctrlv1.ResolverSpec
	switch {
	case f.udp != "":
		spec.Protocol = &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: f.udp}}
	case f.tcp != "":
		spec.Protocol = &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: f.tcp}}
	case f.tls != "":
		spec.Protocol = &ctrlv1.ResolverSpec_Tls{Tls: &ctrlv1.TlsResolver{Address: f.tls, ServerName: f.serverName, CaCert: ca}}
	case f.https != "":
		spec.Protocol = &ctrlv1.ResolverSpec_Https{Https: &ctrlv1.HttpsResolver{Url: f.https, ServerName: f.serverName, CaCert: ca}}
	default:
		return nil, errors.New("give the upstream with one of --udp, --tcp, --tls or --https")
	}
	return &spec, nil
}

var resolvers = kind[resolverClient, *ctrlv1.ResolverSpec, *ctrlv1.Resolver]{
	name:         "resolver",
	plural:       "resolvers",
	specUse:      "(--udp ADDR | --tcp ADDR | --tls ADDR | --https URL) [--server-name N] [--ca-cert FILE]",
	newClient:    ctrlv1connect.NewResolverServiceClient,
	newSpecFlags: func() specFlags[*ctrlv1.ResolverSpec] { return new(resolverFlags) },
	table:        resolverTable,
	revision:     (*ctrlv1.Resolver).GetRevision,

	create: func(ctx context.Context, cl resolverClient, cmd *ctrlv1.CommandMetadata, spec *ctrlv1.ResolverSpec, labels, annotations map[string]string) (proto.Message, *ctrlv1.Resolver, error) {
		return carrying(ctx, cl.CreateResolver, &ctrlv1.CreateResolverRequest{Command: cmd, Spec: spec, Labels: labels, Annotations: annotations}, (*ctrlv1.CreateResolverResponse).GetResolver)
	},
	get: func(ctx context.Context, cl resolverClient, id string) (proto.Message, *ctrlv1.Resolver, error) {
		return carrying(ctx, cl.GetResolver, &ctrlv1.GetResolverRequest{ResolverId: id}, (*ctrlv1.GetResolverResponse).GetResolver)
	},
	list: func(ctx context.Context, cl resolverClient, q listQuery) ([]*ctrlv1.Resolver, string, error) {
		return listed(ctx, cl.ListResolvers, &ctrlv1.ListResolversRequest{PageSize: q.pageSize, PageToken: q.pageToken, LabelSelector: q.selector}, (*ctrlv1.ListResolversResponse).GetResolvers)
	},
	listResponse: func(items []*ctrlv1.Resolver, next string) proto.Message {
		return &ctrlv1.ListResolversResponse{Resolvers: items, NextPageToken: next}
	},
	update: func(ctx context.Context, cl resolverClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, spec *ctrlv1.ResolverSpec, drain *uint32) (proto.Message, *ctrlv1.Resolver, error) {
		return carrying(ctx, cl.UpdateResolver, &ctrlv1.UpdateResolverRequest{Command: cmd, ResolverId: id, ExpectedRevision: expected, Spec: spec, DrainSeconds: drain}, (*ctrlv1.UpdateResolverResponse).GetResolver)
	},
	del: func(ctx context.Context, cl resolverClient, cmd *ctrlv1.CommandMetadata, id string) (proto.Message, error) {
		return call(ctx, cl.DeleteResolver, &ctrlv1.DeleteResolverRequest{Command: cmd, ResolverId: id})
	},
	labels: labelField((*ctrlv1.Resolver).GetLabelsRevision, func(ctx context.Context, cl resolverClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Resolver, error) {
		return carrying(ctx, cl.UpdateResolverLabels, &ctrlv1.UpdateResolverLabelsRequest{Command: cmd, ResolverId: id, ExpectedLabelsRevision: expected, Labels: m}, (*ctrlv1.UpdateResolverLabelsResponse).GetResolver)
	}),
	annotations: annotationField((*ctrlv1.Resolver).GetAnnotationsRevision, func(ctx context.Context, cl resolverClient, cmd *ctrlv1.CommandMetadata, id string, expected uint64, m map[string]string) (proto.Message, *ctrlv1.Resolver, error) {
		return carrying(ctx, cl.UpdateResolverAnnotations, &ctrlv1.UpdateResolverAnnotationsRequest{Command: cmd, ResolverId: id, ExpectedAnnotationsRevision: expected, Annotations: m}, (*ctrlv1.UpdateResolverAnnotationsResponse).GetResolver)
	}),
}
