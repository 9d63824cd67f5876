package server_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
)

func withTLS(address, serverName, ca string) *ctrlv1.EgressSpec {
	s := socks5(address)
	s.GetSocks5().Tls = &ctrlv1.EgressTls{ServerName: serverName, CaCert: ca}
	return s
}

func withAuth(address, user, pass string) *ctrlv1.EgressSpec {
	s := socks5(address)
	s.GetSocks5().Username, s.GetSocks5().Password = user, pass
	return s
}

func u32(v uint32) *uint32 { return &v }

// TestBadInputsAreRejectedAndStoreNothing sends every kind of bad input
// the reference rules out; each must be invalid_argument and leave the
// store as it was.
func TestBadInputsAreRejectedAndStoreNothing(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		_, ca := testtls.New(t, "proxy.example.com")
		good := e.createEgress(socks5("93.184.216.34:1080"), map[string]string{"keep": "me"})
		goodResolver := e.createResolver(&ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "9.9.9.9:53"}}})
		long := strings.Repeat("a", 256)
		key64 := strings.Repeat("k", 64)
		notPEM := "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
		hugeCA := strings.Repeat(ca, 65536/len(ca)+1)

		creates := map[string]*ctrlv1.CreateEgressRequest{
			"no command":                      {Spec: socks5("93.184.216.34:1080")},
			"empty command_id":                {Command: &ctrlv1.CommandMetadata{}, Spec: socks5("93.184.216.34:1080")},
			"command_id over 128 bytes":       {Command: &ctrlv1.CommandMetadata{CommandId: strings.Repeat("c", 129)}, Spec: socks5("93.184.216.34:1080")},
			"no spec":                         {Command: cmd()},
			"no protocol branch":              {Command: cmd(), Spec: &ctrlv1.EgressSpec{UdpEnabled: true}},
			"empty address":                   {Command: cmd(), Spec: socks5("")},
			"address without port":            {Command: cmd(), Spec: socks5("93.184.216.34")},
			"port zero":                       {Command: cmd(), Spec: socks5("93.184.216.34:0")},
			"port above 65535":                {Command: cmd(), Spec: socks5("93.184.216.34:65536")},
			"port with leading zero":          {Command: cmd(), Spec: socks5("93.184.216.34:01080")},
			"hostname with underscore":        {Command: cmd(), Spec: socks5("bad_host.example.com:1080")},
			"IPv6 without brackets":           {Command: cmd(), Spec: socks5("2001:4860::1:1080")},
			"IPv6 with zone":                  {Command: cmd(), Spec: socks5("[fe80::1%eth0]:1080")},
			"loopback":                        {Command: cmd(), Spec: socks5("127.0.0.1:1080")},
			"private 10/8":                    {Command: cmd(), Spec: socks5("10.0.0.1:1080")},
			"private 172.16/12":               {Command: cmd(), Spec: socks5("172.20.1.1:1080")},
			"private 192.168/16":              {Command: cmd(), Spec: socks5("192.168.1.1:1080")},
			"shared 100.64/10":                {Command: cmd(), Spec: socks5("100.64.0.1:1080")},
			"link-local 169.254/16":           {Command: cmd(), Spec: socks5("169.254.169.254:80")},
			"documentation 198.51.100/24":     {Command: cmd(), Spec: socks5("198.51.100.7:1080")},
			"this network 0/8":                {Command: cmd(), Spec: socks5("0.0.0.0:1080")},
			"IPv6 loopback":                   {Command: cmd(), Spec: socks5("[::1]:1080")},
			"IPv6 unique local":               {Command: cmd(), Spec: socks5("[fd12::1]:1080")},
			"IPv6 documentation":              {Command: cmd(), Spec: socks5("[2001:db8::1]:1080")},
			"IPv4-mapped private":             {Command: cmd(), Spec: socks5("[::ffff:10.0.0.1]:1080")},
			"hostname resolving private":      {Command: cmd(), Spec: socks5("internal.example.com:1080")},
			"hostname with one private addr":  {Command: cmd(), Spec: socks5("mixed.example.com:1080")},
			"unresolvable hostname":           {Command: cmd(), Spec: socks5("nowhere.example.com:1080")},
			"username 256 bytes":              {Command: cmd(), Spec: withAuth("93.184.216.34:1080", long, "p")},
			"password 256 bytes":              {Command: cmd(), Spec: withAuth("93.184.216.34:1080", "u", long)},
			"username without password":       {Command: cmd(), Spec: withAuth("93.184.216.34:1080", "u", "")},
			"password without username":       {Command: cmd(), Spec: withAuth("93.184.216.34:1080", "", "p")},
			"ca_cert not PEM":                 {Command: cmd(), Spec: withTLS("93.184.216.34:1080", "", "hello")},
			"ca_cert PEM but not certificate": {Command: cmd(), Spec: withTLS("93.184.216.34:1080", "", notPEM)},
			"ca_cert over 64 KiB":             {Command: cmd(), Spec: withTLS("93.184.216.34:1080", "", hugeCA)},
			"ca_cert trailing garbage":        {Command: cmd(), Spec: withTLS("93.184.216.34:1080", "", ca+"junk")},
			"server_name invalid":             {Command: cmd(), Spec: withTLS("93.184.216.34:1080", "not a name", ca)},
			"label key with space":            {Command: cmd(), Spec: socks5("93.184.216.34:1080"), Labels: map[string]string{"bad key": "v"}},
			"label key name 64 chars":         {Command: cmd(), Spec: socks5("93.184.216.34:1080"), Labels: map[string]string{key64: "v"}},
			"label empty key":                 {Command: cmd(), Spec: socks5("93.184.216.34:1080"), Labels: map[string]string{"": "v"}},
			"label value 64 chars":            {Command: cmd(), Spec: socks5("93.184.216.34:1080"), Labels: map[string]string{"k": key64}},
			"label value with slash":          {Command: cmd(), Spec: socks5("93.184.216.34:1080"), Labels: map[string]string{"k": "a/b"}},
			"label key bad prefix":            {Command: cmd(), Spec: socks5("93.184.216.34:1080"), Labels: map[string]string{"-x.com/k": "v"}},
			"annotation key invalid":          {Command: cmd(), Spec: socks5("93.184.216.34:1080"), Annotations: map[string]string{"no spaces": "v"}},
			"annotation value with NUL":       {Command: cmd(), Spec: socks5("93.184.216.34:1080"), Annotations: map[string]string{"k": "a\x00b"}},
			"annotations over 256 KiB":        {Command: cmd(), Spec: socks5("93.184.216.34:1080"), Annotations: map[string]string{"k": strings.Repeat("x", 256<<10)}},
		}
		for name, req := range creates {
			_, err := e.egress.CreateEgress(ctx, connect.NewRequest(req))
			wantCode(t, "CreateEgress: "+name, err, connect.CodeInvalidArgument)
		}

		updates := map[string]*ctrlv1.UpdateEgressRequest{
			"update without expected_revision": {Command: cmd(), EgressId: good.EgressId, Spec: socks5("93.184.216.34:1081")},
			"update drain_seconds 3601":        {Command: cmd(), EgressId: good.EgressId, ExpectedRevision: 1, Spec: socks5("93.184.216.34:1081"), DrainSeconds: u32(3601)},
			"update to a private endpoint":     {Command: cmd(), EgressId: good.EgressId, ExpectedRevision: 1, Spec: socks5("10.9.9.9:1080")},
			"update without spec":              {Command: cmd(), EgressId: good.EgressId, ExpectedRevision: 1},
			"update without egress_id":         {Command: cmd(), ExpectedRevision: 1, Spec: socks5("93.184.216.34:1081")},
		}
		for name, req := range updates {
			_, err := e.egress.UpdateEgress(ctx, connect.NewRequest(req))
			wantCode(t, name, err, connect.CodeInvalidArgument)
		}
		_, err := e.egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{Command: cmd(),
			EgressId: good.EgressId, Labels: map[string]string{"a": "b"}}))
		wantCode(t, "labels without expected_labels_revision", err, connect.CodeInvalidArgument)
		_, err = e.egress.UpdateEgressLabels(ctx, connect.NewRequest(&ctrlv1.UpdateEgressLabelsRequest{Command: cmd(),
			EgressId: good.EgressId, ExpectedLabelsRevision: 1, Labels: map[string]string{"UPPER/bad": "b"}}))
		wantCode(t, "labels with an invalid key", err, connect.CodeInvalidArgument)

		lists := map[string]*ctrlv1.ListEgressesRequest{
			"page_size above 1000":   {PageSize: 1001},
			"selector invalid key":   {LabelSelector: map[string]string{"bad key": "v"}},
			"selector invalid value": {LabelSelector: map[string]string{"k": "bad value"}},
			"garbage page_token":     {PageToken: "not-a-token"},
		}
		for name, req := range lists {
			_, err := e.egress.ListEgresses(ctx, connect.NewRequest(req))
			wantCode(t, "ListEgresses: "+name, err, connect.CodeInvalidArgument)
		}

		resolverCreates := map[string]*ctrlv1.ResolverSpec{
			"no protocol":             {},
			"udp without port":        {Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "9.9.9.9"}}},
			"tcp empty address":       {Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{}}},
			"tls bad ca_cert":         {Protocol: &ctrlv1.ResolverSpec_Tls{Tls: &ctrlv1.TlsResolver{Address: "9.9.9.9:853", CaCert: "x"}}},
			"tls bad server_name":     {Protocol: &ctrlv1.ResolverSpec_Tls{Tls: &ctrlv1.TlsResolver{Address: "9.9.9.9:853", ServerName: "a..b"}}},
			"https plain http URL":    {Protocol: &ctrlv1.ResolverSpec_Https{Https: &ctrlv1.HttpsResolver{Url: "http://dns.example/dns-query"}}},
			"https URL with password": {Protocol: &ctrlv1.ResolverSpec_Https{Https: &ctrlv1.HttpsResolver{Url: "https://u:p@dns.example/dns-query"}}},
			"https empty URL":         {Protocol: &ctrlv1.ResolverSpec_Https{Https: &ctrlv1.HttpsResolver{}}},
		}
		for name, spec := range resolverCreates {
			_, err := e.resolver.CreateResolver(ctx, connect.NewRequest(&ctrlv1.CreateResolverRequest{Command: cmd(), Spec: spec}))
			wantCode(t, "CreateResolver: "+name, err, connect.CodeInvalidArgument)
		}
		_, err = e.resolver.UpdateResolver(ctx, connect.NewRequest(&ctrlv1.UpdateResolverRequest{Command: cmd(),
			ResolverId: goodResolver.ResolverId, ExpectedRevision: 1, Spec: goodResolver.Spec, DrainSeconds: u32(4000)}))
		wantCode(t, "UpdateResolver drain_seconds 4000", err, connect.CodeInvalidArgument)

		// Nothing changed: one egress and one resolver, exactly as created.
		if n := e.countEgresses(); n != 1 {
			t.Errorf("egresses after bad inputs = %d, want 1", n)
		}
		got, err := e.egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: good.EgressId}))
		if err != nil || !proto.Equal(got.Msg.Egress, good) {
			t.Errorf("egress changed by bad inputs: %v, %v", got, err)
		}
		rs, err := e.resolver.ListResolvers(ctx, connect.NewRequest(&ctrlv1.ListResolversRequest{}))
		if err != nil || len(rs.Msg.Resolvers) != 1 || !proto.Equal(rs.Msg.Resolvers[0], goodResolver) {
			t.Errorf("resolvers after bad inputs: %v, %v", rs, err)
		}
	})
}

func TestValidEdgeCasesAreAccepted(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		_, ca := testtls.New(t, "proxy.example.com")
		for name, spec := range map[string]*ctrlv1.EgressSpec{
			"hostname resolving public":   socks5("proxy.example.com:1080"),
			"IPv6 public in brackets":     socks5("[2606:4700::1111]:1080"),
			"credentials of 255 bytes":    withAuth("93.184.216.34:1080", strings.Repeat("u", 255), strings.Repeat("p", 255)),
			"TLS with server_name and CA": withTLS("93.184.216.34:1080", "proxy.example.com", ca),
			"TLS with nothing set":        withTLS("93.184.216.34:65535", "", ""),
		} {
			if _, err := e.egress.CreateEgress(context.Background(), connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: cmd(), Spec: spec,
				Labels: map[string]string{"example.com/team": "a-b_c.d", "empty": ""}})); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
		for name, spec := range map[string]*ctrlv1.ResolverSpec{
			"udp private upstream":  {Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: "10.0.0.53:53"}}},
			"tcp hostname upstream": {Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: "dns.internal:53"}}},
			"tls with CA":           {Protocol: &ctrlv1.ResolverSpec_Tls{Tls: &ctrlv1.TlsResolver{Address: "9.9.9.9:853", ServerName: "dns.quad9.net", CaCert: ca}}},
			"https":                 {Protocol: &ctrlv1.ResolverSpec_Https{Https: &ctrlv1.HttpsResolver{Url: "https://dns.example:8443/dns-query"}}},
		} {
			if _, err := e.resolver.CreateResolver(context.Background(), connect.NewRequest(&ctrlv1.CreateResolverRequest{Command: cmd(), Spec: spec})); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	})
}
