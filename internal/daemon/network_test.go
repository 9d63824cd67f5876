package daemon_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/host/socks5/socks5test"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// lineServer answers one line per connection with the same line and
// counts the connections it accepted.
type lineServer struct {
	port     int
	accepted atomic.Int64
}

func serveLines(l net.Listener) *lineServer {
	s := &lineServer{port: l.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return s
}

// serveDNS answers internet.test. with the test host's addresses.
func serveDNS(t *testing.T, pc net.PacketConn, l net.Listener) {
	srv := &dns.Server{PacketConn: pc, Listener: l, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		switch {
		case len(q.Question) != 1 || q.Question[0].Name != "internet.test.":
			m.Rcode = dns.RcodeNameError
		case q.Question[0].Qtype == dns.TypeA:
			rr, _ := dns.NewRR("internet.test. 60 IN A " + nettest.HostIPv4.String())
			m.Answer = append(m.Answer, rr)
		case q.Question[0].Qtype == dns.TypeAAAA:
			rr, _ := dns.NewRR("internet.test. 60 IN AAAA " + nettest.HostIPv6.String())
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
}

// netEnv is a deployment with an "internet" test host its workspaces may
// reach through the unsafe exemption, and a workspace on it.
type netEnv struct {
	*deployment
	inet      *nettest.Internet
	egresses  ctrlv1connect.EgressServiceClient
	resolvers ctrlv1connect.ResolverServiceClient
	ws        *ctrlv1.Workspace
	v4, v6    *lineServer
}

func newNetEnv(t *testing.T) *netEnv {
	return newNetEnvResolving(t, netip.AddrPortFrom(nettest.HostIPv4, 53))
}

// newNetEnvResolving is newNetEnv with the test host's DNS server at
// resolver as the deployment resolver.
func newNetEnvResolving(t *testing.T, resolver netip.AddrPort) *netEnv {
	return newNetEnvWith(t, daemon.Options{DeploymentResolvers: []netip.AddrPort{resolver}})
}

// newNetEnvWith is newNetEnv with o's deployment resolvers, metrics
// token file, warm pool and bound of guest connections.
func newNetEnvWith(t *testing.T, o daemon.Options) *netEnv {
	hosttest.RequireRoot(t)
	inet := nettest.NewInternet(t)
	v4 := serveLines(inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0"))
	v6 := serveLines(inet.Listen(t, "tcp6", "["+nettest.HostIPv6.String()+"]:0"))
	serveDNS(t, inet.ListenPacket(t, "udp4", nettest.HostIPv4.String()+":53"), nil)
	serveDNS(t, nil, inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":53"))
	serveDNS(t, inet.ListenPacket(t, "udp6", "["+nettest.HostIPv6.String()+"]:53"), nil)
	exempt := append([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, nettest.ExemptRanges...)
	d := upWith(t, t.TempDir(), daemon.Options{UnsafeExemptRanges: exempt,
		DeploymentResolvers: o.DeploymentResolvers, MetricsTokenFile: o.MetricsTokenFile, WarmPool: o.WarmPool,
		GuestConnections: o.GuestConnections})
	t.Cleanup(d.stop)
	token, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	auth := connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token))))
	e := &netEnv{deployment: d, inet: inet, v4: v4, v6: v6,
		egresses:  ctrlv1connect.NewEgressServiceClient(http.DefaultClient, d.url, auth),
		resolvers: ctrlv1connect.NewResolverServiceClient(http.DefaultClient, d.url, auth)}
	ws := d.create(small())
	e.ws = d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	return e
}

// awaitApplied waits until the host confirms policy revision rev and
// returns the workspace.
func (e *netEnv) awaitApplied(rev uint64) *ctrlv1.Workspace {
	e.t.Helper()
	return e.awaitWorkspace(fmt.Sprintf("policy revision %d applied", rev), func(ws *ctrlv1.Workspace) bool {
		return ws.NetworkPolicyStatus.GetAppliedRevision() == rev
	})
}

func (e *netEnv) awaitWorkspace(what string, cond func(*ctrlv1.Workspace) bool) *ctrlv1.Workspace {
	e.t.Helper()
	return e.deployment.awaitWorkspace(e.ws.WorkspaceId, what, cond)
}

// setPolicy replaces the policy, closing moved connections at once, and
// waits until the host applied it.
func (e *netEnv) setPolicy(p *ctrlv1.NetworkPolicy) *ctrlv1.Workspace {
	e.t.Helper()
	return e.setPolicyDrain(p, 0)
}

// setPolicyDrain replaces the policy with a drain and waits until the
// host applied it.
func (e *netEnv) setPolicyDrain(p *ctrlv1.NetworkPolicy, drain uint32) *ctrlv1.Workspace {
	e.t.Helper()
	resp, err := e.client.GetWorkspace(context.Background(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: e.ws.WorkspaceId}))
	if err != nil {
		e.t.Fatal(err)
	}
	up, err := e.client.UpdateWorkspaceNetworkPolicy(context.Background(), connect.NewRequest(&ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
		Command: cmd(), WorkspaceId: e.ws.WorkspaceId, ExpectedRevision: resp.Msg.Workspace.Spec.NetworkPolicy.Revision,
		Policy: p, DrainSeconds: &drain}))
	if err != nil {
		e.t.Fatalf("UpdateWorkspaceNetworkPolicy: %v", err)
	}
	return e.awaitApplied(up.Msg.Workspace.Spec.NetworkPolicy.Revision)
}

// createEgress creates an Egress and returns its ID.
func (e *netEnv) createEgress(spec *ctrlv1.EgressSpec) string {
	e.t.Helper()
	return mustUnary(e.t, e.egresses.CreateEgress, &ctrlv1.CreateEgressRequest{Command: cmd(), Spec: spec}).Egress.EgressId
}

// replaceEgress updates the spec of the Egress at revision 1 and waits
// until the host applied revision 2.
func (e *netEnv) replaceEgress(egressID string, spec *ctrlv1.EgressSpec) {
	e.t.Helper()
	mustUnary(e.t, e.egresses.UpdateEgress, &ctrlv1.UpdateEgressRequest{Command: cmd(), EgressId: egressID, ExpectedRevision: 1, Spec: spec})
	e.awaitWorkspace("the Egress's revision 2 applied", func(ws *ctrlv1.Workspace) bool {
		st := ws.NetworkPolicyStatus.GetEgresses()
		return len(st) == 1 && st[0].AppliedRevision == 2
	})
}

// createResolver creates a Resolver.
func (e *netEnv) createResolver(spec *ctrlv1.ResolverSpec) *ctrlv1.Resolver {
	e.t.Helper()
	return mustUnary(e.t, e.resolvers.CreateResolver, &ctrlv1.CreateResolverRequest{Command: cmd(), Spec: spec}).Resolver
}

// forwardThrough sets a public policy that forwards destinations through
// the Egress and sends the Resolver's queries through it as well.
func (e *netEnv) forwardThrough(egressID string, destinations []string, resolverID string) {
	e.t.Helper()
	e.setPolicy(public(func(p *ctrlv1.NetworkPolicy) {
		p.Egresses = []*ctrlv1.NetworkPolicyEgress{{EgressId: egressID, Destinations: destinations}}
		p.Resolvers = []*ctrlv1.NetworkPolicyResolver{{ResolverId: resolverID,
			Path: &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_EgressId{EgressId: egressID}}}}
	}))
}

// resolveDirect sets a public policy that sends the Resolver's queries
// straight to its upstream.
func (e *netEnv) resolveDirect(resolverID string) {
	e.t.Helper()
	e.setPolicy(public(func(p *ctrlv1.NetworkPolicy) {
		p.Resolvers = []*ctrlv1.NetworkPolicyResolver{{ResolverId: resolverID,
			Path: &ctrlv1.ResolverPath{Kind: &ctrlv1.ResolverPath_Direct{Direct: &ctrlv1.ResolverDirectPath{}}}}}
	}))
}

// udpResolver and tcpResolver are the specs of plain DNS upstreams.
func udpResolver(addr string) *ctrlv1.ResolverSpec {
	return &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: addr}}}
}

func tcpResolver(addr string) *ctrlv1.ResolverSpec {
	return &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tcp{Tcp: &ctrlv1.TcpResolver{Address: addr}}}
}

// talk sends a line from the guest to addr and reports whether it came
// back.
func (e *netEnv) talk(addr string) bool {
	host, port, _ := net.SplitHostPort(addr)
	out, err := e.exec(e.ws, "sh", "-c", fmt.Sprintf("echo hello | nc -w 3 %s %s", host, port))
	return err == nil && strings.Contains(out, "hello")
}

func public(mut func(*ctrlv1.NetworkPolicy)) *ctrlv1.NetworkPolicy {
	p := &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET}
	if mut != nil {
		mut(p)
	}
	return p
}

// TestNetworkPolicyDirect checks the slot of a real workspace: DENY_ALL by
// default (DNS refused at once), PUBLIC_INTERNET over both families, the
// hard deny of the platform's own addresses, and allow over deny.
func TestNetworkPolicyDirect(t *testing.T) {
	e := newNetEnv(t)
	v4 := net.JoinHostPort(nettest.HostIPv4.String(), fmt.Sprint(e.v4.port))
	v6 := net.JoinHostPort(nettest.HostIPv6.String(), fmt.Sprint(e.v6.port))

	e.awaitApplied(1)
	if out, err := e.exec(e.ws, "cat", "/etc/resolv.conf"); err != nil || strings.TrimSpace(out) != "nameserver 10.211.0.1" {
		t.Errorf("resolv.conf %q, %v", out, err)
	}
	if e.talk(v4) || e.talk(v6) {
		t.Fatal("DENY_ALL let a connection out")
	}
	if out, err := e.exec(e.ws, "nslookup", "internet.test"); err == nil || strings.Contains(out, nettest.HostIPv4.String()) {
		t.Fatalf("DNS under DENY_ALL answered: %q", out)
	}
	if n := e.v4.accepted.Load() + e.v6.accepted.Load(); n != 0 {
		t.Fatalf("the test host accepted %d connections under DENY_ALL", n)
	}

	e.setPolicy(public(nil))
	for _, addr := range []string{v4, v6} {
		if !e.talk(addr) {
			t.Fatalf("PUBLIC_INTERNET did not reach the test host at %s", addr)
		}
	}
	if out, err := e.exec(e.ws, "nslookup", "internet.test"); err != nil || !strings.Contains(out, nettest.HostIPv4.String()) {
		t.Fatalf("DNS under PUBLIC_INTERNET: %q, %v", out, err)
	}
	ctrlPort := strings.TrimPrefix(e.url, "http://127.0.0.1:")
	for _, addr := range []string{
		"127.0.0.1:" + ctrlPort, // ctrl and the host agent's gateway
		net.JoinHostPort(nettest.UplinkIPv4.String(), fmt.Sprint(e.v4.port)), // the host's own address
		"10.211.0.1:" + ctrlPort, // the slot's gateway
		"[::1]:" + ctrlPort,
	} {
		if e.talk(addr) {
			t.Errorf("the guest reached %s", addr)
		}
	}

	// Another workspace listening is out of reach: every slot has the same
	// addresses, and nothing routes between slots.
	other := e.create(small())
	other = e.await(other.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if _, err := e.exec(other, "sh", "-c", "nc -ll -p 8080 -e cat </dev/null >/dev/null 2>&1 &"); err != nil {
		t.Fatal(err)
	}
	if out, err := e.exec(other, "sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo hello | nc -w 2 127.0.0.1 8080 && exit; sleep 0.2; done; exit 1"); err != nil || !strings.Contains(out, "hello") {
		t.Fatalf("the other workspace's listener does not answer itself: %q, %v", out, err)
	}
	for _, addr := range []string{"10.211.0.2:8080", "[fd6b:6962::2]:8080"} {
		if e.talk(addr) {
			t.Errorf("the guest reached another workspace's listener at %s", addr)
		}
	}

	// Allow entries in hard-deny ranges never open direct traffic.
	e.setPolicy(public(func(p *ctrlv1.NetworkPolicy) { p.Allow = []string{"127.0.0.0/8", "::1"} }))
	if e.talk("127.0.0.1:"+ctrlPort) || e.talk("[::1]:"+ctrlPort) {
		t.Error("an allow entry opened the hard deny")
	}
	e.setPolicy(public(func(p *ctrlv1.NetworkPolicy) { p.Deny = []string{"198.51.100.0/24"} }))
	if e.talk(v4) {
		t.Error("a denied destination was reached")
	}
	if !e.talk(v6) {
		t.Error("an IPv4 deny entry closed IPv6")
	}
	e.setPolicy(public(func(p *ctrlv1.NetworkPolicy) {
		p.Deny = []string{"198.51.100.0/24"}
		p.Allow = []string{nettest.HostIPv4.String()}
	}))
	if !e.talk(v4) {
		t.Error("allow did not win over deny")
	}
}

// TestNetworkPolicyEgress forwards through a SOCKS5 Egress with
// authentication: the address the guest dialed arrives at the proxy, a
// private destination is forwarded without the hard deny, a failing Egress
// resets the guest's connection without falling back, and its observation
// appears and clears.
func TestNetworkPolicyEgress(t *testing.T) {
	e := newNetEnv(t)
	proxy := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{Username: "user", Password: "secret"})
	egressID := e.createEgress(&ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{
		Address: proxy.Addr(), Username: "user", Password: "secret"}}})
	v4 := net.JoinHostPort(nettest.HostIPv4.String(), fmt.Sprint(e.v4.port))
	ws := e.setPolicy(public(func(p *ctrlv1.NetworkPolicy) {
		p.Egresses = []*ctrlv1.NetworkPolicyEgress{{EgressId: egressID, Destinations: []string{nettest.HostIPv4.String(), "10.77.0.0/16"}}}
	}))
	if st := ws.NetworkPolicyStatus.GetEgresses(); len(st) != 1 || st[0].EgressId != egressID || st[0].AppliedRevision != 1 {
		t.Fatalf("egress status %v", st)
	}
	if !e.talk(v4) {
		t.Fatal("no connection through the Egress")
	}
	e.talk("10.77.1.2:80") // forwarded: the proxy, not the hard deny, decides
	connects := strings.Join(proxy.Connects(), " ")
	if !strings.Contains(connects, v4) || !strings.Contains(connects, "10.77.1.2:80") {
		t.Fatalf("the proxy saw %q, want the addresses the guest dialed", connects)
	}

	proxy.SetFault(socks5test.RejectAuth)
	before := e.v4.accepted.Load()
	if e.talk(v4) {
		t.Fatal("a connection succeeded through an Egress that rejects its credentials")
	}
	if after := e.v4.accepted.Load(); after != before {
		t.Fatal("the failed forward fell back to leaving directly")
	}
	ws = e.awaitWorkspace("an AUTHENTICATION_FAILED observation", func(ws *ctrlv1.Workspace) bool {
		return len(ws.EgressObservations) == 1 &&
			ws.EgressObservations[0].Kind == ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_AUTHENTICATION_FAILED
	})
	o := ws.EgressObservations[0]
	if o.EgressId != egressID || o.FailingSince == nil || o.ObservedAt == nil || strings.Contains(o.Error, "secret") {
		t.Fatalf("observation %v", o)
	}
	proxy.SetFault(socks5test.None)
	if !e.talk(v4) {
		t.Fatal("no connection after the Egress recovered")
	}
	e.awaitWorkspace("the observation to clear", func(ws *ctrlv1.Workspace) bool { return len(ws.EgressObservations) == 0 })
}

// TestNetworkPolicyResolvers answers the guest's DNS through the policy's
// Resolver, directly and through an Egress: an unavailable upstream is
// SERVFAIL with no fallback and an observation, cleared by the next answer
// after UpdateResolver fixes it.
func TestNetworkPolicyResolvers(t *testing.T) {
	e := newNetEnv(t)
	ctx := context.Background()
	// Nothing answers on port 5353: the upstream is unreachable.
	res := e.createResolver(udpResolver(nettest.HostIPv4.String() + ":5353"))
	e.resolveDirect(res.ResolverId)
	if out, err := e.exec(e.ws, "nslookup", "internet.test"); err == nil || strings.Contains(out, nettest.HostIPv4.String()) {
		t.Fatalf("an unavailable Resolver answered (or fell back): %q", out)
	}
	ws := e.awaitWorkspace("an UPSTREAM_UNREACHABLE observation", func(ws *ctrlv1.Workspace) bool {
		return len(ws.ResolverObservations) == 1 &&
			ws.ResolverObservations[0].Kind == ctrlv1.ResolverObservationKind_RESOLVER_OBSERVATION_KIND_UPSTREAM_UNREACHABLE
	})
	if o := ws.ResolverObservations[0]; o.ResolverId != res.ResolverId || o.Path.GetDirect() == nil || o.FailingSince == nil {
		t.Fatalf("observation %v", o)
	}

	if _, err := e.resolvers.UpdateResolver(ctx, connect.NewRequest(&ctrlv1.UpdateResolverRequest{Command: cmd(),
		ResolverId: res.ResolverId, ExpectedRevision: res.Revision, Spec: udpResolver(nettest.HostIPv4.String() + ":53")})); err != nil {
		t.Fatal(err)
	}
	e.awaitWorkspace("the Resolver's revision 2 applied", func(ws *ctrlv1.Workspace) bool {
		st := ws.NetworkPolicyStatus.GetResolvers()
		return len(st) == 1 && st[0].AppliedRevision == 2
	})
	// A UDP datagram may be lost: the guest's resolver retries, and so
	// does this check, a few times.
	for attempt := 1; ; attempt++ {
		out, err := e.exec(e.ws, "nslookup", "internet.test")
		if err == nil && strings.Contains(out, nettest.HostIPv4.String()) {
			break
		}
		if attempt == 3 {
			t.Fatalf("the fixed Resolver: %q, %v", out, err)
		}
	}
	e.awaitWorkspace("the observation to clear", func(ws *ctrlv1.Workspace) bool { return len(ws.ResolverObservations) == 0 })

	// Through an Egress: the proxy carries the upstream's TCP connection.
	proxy := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{})
	egressID := e.createEgress(&ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: proxy.Addr()}}})
	e.forwardThrough(egressID, []string{"203.0.113.0/24"}, e.createResolver(tcpResolver(nettest.HostIPv4.String()+":53")).ResolverId)
	if out, err := e.exec(e.ws, "nslookup", "internet.test"); err != nil || !strings.Contains(out, nettest.HostIPv4.String()) {
		t.Fatalf("DNS through the Egress: %q, %v", out, err)
	}
	if connects := strings.Join(proxy.Connects(), " "); !strings.Contains(connects, nettest.HostIPv4.String()+":53") {
		t.Fatalf("the proxy saw %q, want the upstream", connects)
	}
}

// TestNetworkPolicyEgressTLS forwards through an Egress reached over TLS
// that also carries the udp Resolver's queries (UDP ASSOCIATE), then sees
// a certificate it cannot trust reported as TLS_VERIFICATION_FAILED.
func TestNetworkPolicyEgressTLS(t *testing.T) {
	e := newNetEnv(t)
	serverTLS, caPEM := testtls.New(t, "proxy.test")
	// On the host's side of the test link: its UDP relay sends from there.
	proxy := socks5test.Start(t, nettest.UplinkIPv4.String()+":0", socks5test.Options{TLS: serverTLS, UDP: true})
	spec := func(ca string) *ctrlv1.EgressSpec {
		return &ctrlv1.EgressSpec{UdpEnabled: true, Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{
			Address: proxy.Addr(), Tls: &ctrlv1.EgressTls{ServerName: "proxy.test", CaCert: ca}}}}
	}
	egressID := e.createEgress(spec(caPEM))
	e.forwardThrough(egressID, []string{"198.51.100.0/24"}, e.createResolver(udpResolver(nettest.HostIPv4.String()+":53")).ResolverId)
	if !e.talk(net.JoinHostPort(nettest.HostIPv4.String(), fmt.Sprint(e.v4.port))) {
		t.Fatal("no connection through the TLS Egress")
	}
	if out, err := e.exec(e.ws, "nslookup", "internet.test"); err != nil || !strings.Contains(out, nettest.HostIPv4.String()) {
		t.Fatalf("DNS through the Egress's UDP association: %q, %v", out, err)
	}
	if proxy.UDPDatagrams() == 0 {
		t.Fatal("the queries did not go through the UDP association")
	}

	_, otherCA := testtls.New(t, "proxy.test")
	e.replaceEgress(egressID, spec(otherCA))
	if e.talk(net.JoinHostPort(nettest.HostIPv4.String(), fmt.Sprint(e.v4.port))) {
		t.Fatal("a connection went through an Egress whose certificate is not trusted")
	}
	e.awaitWorkspace("a TLS_VERIFICATION_FAILED observation", func(ws *ctrlv1.Workspace) bool {
		return len(ws.EgressObservations) == 1 &&
			ws.EgressObservations[0].Kind == ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_TLS_VERIFICATION_FAILED
	})
}

// heldConnection has the guest open a connection to a listener of the test
// host that stays open (busybox nc, fed by sleep) and returns the test
// host's end of it, closed with the test.
func (e *netEnv) heldConnection() net.Conn {
	e.t.Helper()
	hold := e.inet.Listen(e.t, "tcp4", nettest.HostIPv4.String()+":0")
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := hold.Accept(); err == nil {
			accepted <- c
		}
	}()
	port := hold.Addr().(*net.TCPAddr).Port
	if _, err := e.exec(e.ws, "sh", "-c", fmt.Sprintf("(sleep 60 | nc %s %d) </dev/null >/dev/null 2>&1 &", nettest.HostIPv4, port)); err != nil {
		e.t.Fatal(err)
	}
	select {
	case c := <-accepted:
		e.t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(10 * time.Second):
		e.t.Fatal("the guest's connection did not arrive")
		return nil
	}
}

// TestNetworkPolicyDrain moves an open guest connection off its path with
// a 3 s drain: it keeps working for the window, is reported draining, and
// closes when the window ends.
func TestNetworkPolicyDrain(t *testing.T) {
	e := newNetEnv(t)
	e.setPolicy(public(nil)) // revision 2
	c := e.heldConnection()

	const drain = 3 * time.Second
	start := time.Now()
	ws := e.setPolicyDrain(&ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL}, uint32(drain/time.Second))
	if got := ws.NetworkPolicyStatus.GetDrainingRevision(); got != 2 {
		t.Fatalf("draining revision %d, want 2", got)
	}
	buf := make([]byte, 1)
	c.SetReadDeadline(start.Add(drain - 500*time.Millisecond))
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection during its drain: %v, want it open", err)
	}
	c.SetReadDeadline(time.Now().Add(drain + 5*time.Second))
	_, err := c.Read(buf)
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection after its drain: %v, want it closed", err)
	}
	if took := time.Since(start); took < drain {
		t.Fatalf("closed after %s, before its %s drain", took, drain)
	}
	e.awaitWorkspace("draining revision 0", func(ws *ctrlv1.Workspace) bool {
		return ws.NetworkPolicyStatus.GetAppliedRevision() == 3 && ws.NetworkPolicyStatus.GetDrainingRevision() == 0
	})
}

// TestNetworkPolicyDeletedEgressEndsItsDrain: deleting an Egress that only
// the connections of an earlier policy still go through is allowed (no
// policy references it), and closes those connections at once instead of
// at the end of their drain.
func TestNetworkPolicyDeletedEgressEndsItsDrain(t *testing.T) {
	e := newNetEnv(t)
	proxy := socks5test.Start(t, "127.0.0.1:0", socks5test.Options{})
	egressID := e.createEgress(&ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: proxy.Addr()}}})
	e.setPolicy(public(func(p *ctrlv1.NetworkPolicy) {
		p.Egresses = []*ctrlv1.NetworkPolicyEgress{{EgressId: egressID, Destinations: []string{nettest.HostIPv4.String()}}}
	}))
	c := e.heldConnection()
	if port := c.LocalAddr().(*net.TCPAddr).Port; !strings.Contains(strings.Join(proxy.Connects(), " "), fmt.Sprint(port)) {
		t.Fatalf("the proxy saw %v, not the connection to port %d", proxy.Connects(), port)
	}

	e.setPolicyDrain(&ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL}, 600)
	deleted := time.Now()
	mustUnary(t, e.egresses.DeleteEgress, &ctrlv1.DeleteEgressRequest{Command: cmd(), EgressId: egressID})
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection through the deleted Egress, 20 s into its 600 s drain: %v, want it closed", err)
	}
	t.Logf("closed %s after the deletion", time.Since(deleted).Round(time.Millisecond))
	e.awaitWorkspace("draining revision 0", func(ws *ctrlv1.Workspace) bool {
		return ws.NetworkPolicyStatus.GetDrainingRevision() == 0
	})
}

// TestNetworkPolicyEgressFaults breaks an Egress in each way a workspace
// observes and heals it in between: each run of failures appears with its
// kind and clears with the next success.
func TestNetworkPolicyEgressFaults(t *testing.T) {
	e := newNetEnv(t)
	// On the host's side of the test link: its UDP relay sends from there.
	proxy := socks5test.Start(t, nettest.UplinkIPv4.String()+":0", socks5test.Options{UDP: true})
	spec := func(addr string) *ctrlv1.EgressSpec {
		return &ctrlv1.EgressSpec{UdpEnabled: true, Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: addr}}}
	}
	egressID := e.createEgress(spec(proxy.Addr()))
	e.forwardThrough(egressID, []string{nettest.HostIPv4.String()}, e.createResolver(udpResolver(nettest.HostIPv4.String()+":53")).ResolverId)
	v4 := net.JoinHostPort(nettest.HostIPv4.String(), fmt.Sprint(e.v4.port))
	lookup := func() bool {
		out, err := e.exec(e.ws, "nslookup", "internet.test")
		return err == nil && strings.Contains(out, nettest.HostIPv4.String())
	}
	observed := func(kind ctrlv1.EgressObservationKind) {
		t.Helper()
		e.awaitWorkspace(kind.String(), func(ws *ctrlv1.Workspace) bool {
			return len(ws.EgressObservations) == 1 && ws.EgressObservations[0].Kind == kind && ws.EgressObservations[0].EgressId == egressID
		})
	}
	cleared := func() {
		t.Helper()
		if !e.talk(v4) {
			t.Fatal("no connection through the healed Egress")
		}
		e.awaitWorkspace("the observation to clear", func(ws *ctrlv1.Workspace) bool { return len(ws.EgressObservations) == 0 })
	}
	for _, c := range []struct {
		fault socks5test.Fault
		use   func() bool
		kind  ctrlv1.EgressObservationKind
	}{
		{socks5test.Garbage, func() bool { return e.talk(v4) }, ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_HANDSHAKE_FAILED},
		{socks5test.RefuseUDP, lookup, ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_UDP_ASSOCIATION_FAILED},
	} {
		proxy.SetFault(c.fault)
		if c.use() {
			t.Fatalf("%v: the guest got through a broken Egress", c.fault)
		}
		observed(c.kind)
		proxy.SetFault(socks5test.None)
		cleared()
	}
	if !lookup() {
		t.Fatal("DNS through the healed Egress failed")
	}

	// An endpoint nothing listens on.
	l, err := net.Listen("tcp4", nettest.UplinkIPv4.String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	e.replaceEgress(egressID, spec(closed))
	if e.talk(v4) {
		t.Fatal("a connection went through an unreachable Egress")
	}
	observed(ctrlv1.EgressObservationKind_EGRESS_OBSERVATION_KIND_ENDPOINT_UNREACHABLE)
}

// TestNetworkPolicyResolverFaults points the policy at upstreams broken
// in each way a workspace observes: each query is answered SERVFAIL (no
// fallback) and the run appears with its kind; replacing the entry drops
// the old one's run.
func TestNetworkPolicyResolverFaults(t *testing.T) {
	e := newNetEnv(t)
	silent := e.inet.ListenPacket(t, "udp4", nettest.HostIPv4.String()+":0") // reads nothing, answers nothing
	serverTLS, caPEM := testtls.New(t, "dns.test")
	_, otherCA := testtls.New(t, "dns.test")
	hl := e.inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	srv := &http.Server{TLSConfig: serverTLS, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "broken", http.StatusInternalServerError)
	})}
	go srv.ServeTLS(hl, "", "")
	t.Cleanup(func() { srv.Close() })
	tlsAddr := hl.Addr().String()

	for _, c := range []struct {
		name string
		spec *ctrlv1.ResolverSpec
		kind ctrlv1.ResolverObservationKind
	}{
		{"silent udp", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Udp{Udp: &ctrlv1.UdpResolver{Address: silent.LocalAddr().String()}}},
			ctrlv1.ResolverObservationKind_RESOLVER_OBSERVATION_KIND_UPSTREAM_TIMEOUT},
		{"https answering 500", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Https{Https: &ctrlv1.HttpsResolver{
			Url: "https://" + tlsAddr + "/dns-query", ServerName: "dns.test", CaCert: caPEM}}},
			ctrlv1.ResolverObservationKind_RESOLVER_OBSERVATION_KIND_HTTP_ERROR_STATUS},
		{"tls with an untrusted certificate", &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tls{Tls: &ctrlv1.TlsResolver{
			Address: tlsAddr, ServerName: "dns.test", CaCert: otherCA}}},
			ctrlv1.ResolverObservationKind_RESOLVER_OBSERVATION_KIND_TLS_VERIFICATION_FAILED},
	} {
		id := e.createResolver(c.spec).ResolverId
		e.resolveDirect(id)
		if out, err := e.exec(e.ws, "nslookup", "internet.test"); err == nil || strings.Contains(out, nettest.HostIPv4.String()) {
			t.Fatalf("%s answered (or fell back): %q", c.name, out)
		}
		// Under load an exchange may also time out before the fault shows:
		// another run of this Resolver may stand beside the one awaited,
		// but none of the replaced ones.
		e.awaitWorkspace(c.name+": "+c.kind.String(), func(ws *ctrlv1.Workspace) bool {
			seen := false
			for _, o := range ws.ResolverObservations {
				if o.ResolverId != id {
					return false
				}
				seen = seen || o.Kind == c.kind
			}
			return seen
		})
	}
}

// TestNetworkPolicyIPv6LinkDNS runs a deployment whose first resolver is
// IPv6: the guest's nameserver is fe80::1 on its link, refused under
// DENY_ALL and answered through the IPv6 resolver under PUBLIC_INTERNET,
// and so is 10.211.0.1, the address a guest started under an IPv4 first
// resolver keeps in its resolv.conf when its host restarts.
func TestNetworkPolicyIPv6LinkDNS(t *testing.T) {
	e := newNetEnvResolving(t, netip.AddrPortFrom(nettest.HostIPv6, 53))
	e.awaitApplied(1)
	if out, err := e.exec(e.ws, "cat", "/etc/resolv.conf"); err != nil || strings.TrimSpace(out) != "nameserver fe80::1%eth0" {
		t.Fatalf("resolv.conf %q, %v", out, err)
	}
	if out, err := e.exec(e.ws, "nslookup", "internet.test"); err == nil || strings.Contains(out, nettest.HostIPv4.String()) {
		t.Fatalf("DNS under DENY_ALL answered: %q", out)
	}
	e.setPolicy(public(nil))
	if out, err := e.exec(e.ws, "nslookup", "internet.test"); err != nil || !strings.Contains(out, nettest.HostIPv4.String()) {
		t.Fatalf("DNS over the IPv6 link address: %q, %v", out, err)
	}
	if out, err := e.exec(e.ws, "nslookup", "internet.test", "10.211.0.1"); err != nil || !strings.Contains(out, nettest.HostIPv4.String()) {
		t.Fatalf("DNS over the IPv4 link address: %q, %v", out, err)
	}
}

// TestNetworkPolicyNewHostAddress adds an address to the host while a
// workspace runs, inside a range the operator exempted: the host's own
// address stays out of reach.
func TestNetworkPolicyNewHostAddress(t *testing.T) {
	e := newNetEnv(t)
	e.setPolicy(public(nil))
	link, err := netlink.LinkByName(e.inet.HostLink)
	if err != nil {
		t.Fatal(err)
	}
	added := netip.MustParseAddr("198.51.100.77") // goes with the link
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: added.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp4", added.String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	srv := serveLines(l)
	// At once: the slot asks the kernel at each dial, before the host agent
	// hears of the address through netlink.
	if e.talk(l.Addr().String()) || srv.accepted.Load() != 0 {
		t.Fatal("the guest reached an address the host gained while it ran")
	}
}

// TestNetworkPolicyDNSCache resolves the same name twice in a real
// workspace through a Resolver that counts its queries: the slot answers
// the second from its cache, and after a change to DENY_ALL it refuses
// the name it holds, asking the Resolver nothing.
func TestNetworkPolicyDNSCache(t *testing.T) {
	e := newNetEnv(t)
	var asked atomic.Int32
	pc := e.inet.ListenPacket(t, "udp4", nettest.HostIPv4.String()+":0")
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg).SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			asked.Add(1)
			rr, _ := dns.NewRR(q.Question[0].Name + " 300 IN A " + nettest.HostIPv4.String())
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	e.resolveDirect(e.createResolver(udpResolver(pc.LocalAddr().String())).ResolverId)
	for range 2 {
		if out, err := e.exec(e.ws, "nslookup", "-type=a", "cached.test"); err != nil || !strings.Contains(out, nettest.HostIPv4.String()) {
			t.Fatalf("nslookup: %q, %v", out, err)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("the Resolver was asked %d times, want once", n)
	}
	e.setPolicy(&ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL})
	if out, err := e.exec(e.ws, "nslookup", "-type=a", "cached.test"); err == nil || strings.Contains(out, nettest.HostIPv4.String()) {
		t.Fatalf("under DENY_ALL the cached name resolved: %q", out)
	}
	if n := asked.Load(); n != 1 {
		t.Fatalf("under DENY_ALL the Resolver was asked (%d)", n)
	}
}

// TestGuestConnectionsBound: with --guest-connections 2, a workspace's
// slot carries two of its connections at once and resets a third, which
// goes through once one of the two ends.
func TestGuestConnectionsBound(t *testing.T) {
	e := newNetEnvWith(t, daemon.Options{DeploymentResolvers: []netip.AddrPort{netip.AddrPortFrom(nettest.HostIPv4, 53)}, GuestConnections: 2})
	e.setPolicy(public(nil))
	addr := net.JoinHostPort(nettest.HostIPv4.String(), fmt.Sprint(e.v4.port))
	host, port, _ := net.SplitHostPort(addr)
	// Two connections held open (the server answers a line, which they do
	// not send), then a third.
	out, err := e.exec(e.ws, "sh", "-c", fmt.Sprintf(`sleep 3 | nc %[1]s %[2]s & sleep 3 | nc %[1]s %[2]s &
		sleep 0.5; echo third | nc -w 2 %[1]s %[2]s; echo "third: $?"; wait`, host, port))
	if err != nil || !strings.Contains(out, "third: 1") || strings.Contains(out, "third\n") {
		t.Errorf("a third connection of two allowed: %v %q, want it reset", err, out)
	}
	if !e.talk(addr) {
		t.Error("no connection once the two ended")
	}
}
