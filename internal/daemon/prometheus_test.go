package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
	"github.com/kibotos/kibotos/internal/testutil/promtest"
	"github.com/kibotos/kibotos/sdk"
)

// TestDeploymentMetrics runs `kibotos up` with a metrics token and checks, through
// GET /metrics parsed with the Prometheus text parser, that the token is
// required and that the counters and gauges move with the right labels as
// calls are made: a workspace created and running on the host (the census
// and the host's capacity, reservations and template delivery), its guest
// answering probes, an exec through the data plane, guest connections
// refused by the policy, carried directly, and lost to a broken Egress, DNS
// queries answered upstream and from the slot's cache, a
// Resolver that never answers, and calls refused with their codes.
func TestDeploymentMetrics(t *testing.T) {
	const token = "scrape-secret"
	tokenFile := filepath.Join(t.TempDir(), "metrics-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newNetEnvWith(t, daemon.Options{DeploymentResolvers: []netip.AddrPort{netip.AddrPortFrom(nettest.HostIPv4, 53)},
		MetricsTokenFile: tokenFile})
	client := http.DefaultClient
	for _, wrong := range []string{"", "scrape-secre", token + "x"} {
		if status, body := promtest.Get(t, client, e.url, wrong); status != http.StatusUnauthorized {
			t.Fatalf("GET /metrics with token %q: %d %s, want 401", wrong, status, body)
		}
	}
	scrape := func() promtest.Families { return promtest.Scrape(t, client, e.url, token) }
	// value reads one series of a fresh scrape.
	value := func(name string, labels ...string) float64 { return scrape().Must(t, name, labels...) }
	want := func(what string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	calls := func(service, method, code string) float64 {
		t.Helper()
		v, _ := scrape().Value("kibotos_api_calls_total", "service", "kibotos."+service, "method", method, "code", code)
		return v
	}
	host := []string{"host", "local"}
	slot := func(name, label, value string) float64 {
		t.Helper()
		return scrape().Must(t, "kibotos_host_slot_"+name+"_total", append([]string{label, value}, host...)...)
	}

	// The workspace newNetEnv created and waited for.
	f := scrape()
	want("CreateWorkspace ok", f.Must(t, "kibotos_api_calls_total", "service", "kibotos.ctrl.v1.WorkspaceService", "method", "CreateWorkspace", "code", "ok"), 1)
	want("CreateWorkspace latencies", f.Must(t, "kibotos_api_call_duration_seconds", "service", "kibotos.ctrl.v1.WorkspaceService", "method", "CreateWorkspace"), 1)
	if f.Must(t, "kibotos_api_calls_total", "service", "kibotos.host.v1.HostService", "method", "ReportExecutions", "code", "ok") < 1 {
		t.Error("no ReportExecutions call of the host agent counted")
	}
	want("available workspaces", f.Must(t, "kibotos_workspaces", "state", "available"), 1)
	want("creating workspaces", f.Must(t, "kibotos_workspaces", "state", "creating"), 0)
	want("reserved memory", f.Must(t, "kibotos_host_reserved_memory_bytes", host...), 128*mib)
	want("reserved CPU", f.Must(t, "kibotos_host_reserved_cpu_millis", host...), 500)
	want("reserved layer bytes", f.Must(t, "kibotos_host_reserved_layer_bytes", host...), 64*mib)
	if f.Must(t, "kibotos_host_capacity_memory_bytes", host...) < 128*mib {
		t.Error("the host offers less memory than it holds")
	}
	if f.Must(t, "kibotos_host_template_delivery_bytes_total", host...) == 0 {
		t.Error("the first workspace of a new deployment delivered no template bytes")
	}
	if _, ok := f.Value("go_goroutines"); !ok {
		t.Error("no Go runtime metrics")
	}
	eventually(t, 30*time.Second, "the guest counted RESPONDING", func() (float64, error) {
		return value("kibotos_workspace_guest_conditions", "condition", "responding"), nil
	}, func(v float64) bool { return v == 1 })

	// An exec through the data plane issues a session.
	handle, err := e.sdkClient().Workspace(context.Background(), e.ws.WorkspaceId)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if st, err := handle.Exec(context.Background(), []string{"echo", "counted"}, sdk.ExecOptions{Stdout: &out}); err != nil || !st.Success() || out.String() != "counted\n" {
		t.Fatalf("exec: %+v, %v, %q", st, err, out.String())
	}
	want("IssueSession ok", calls("ctrl.v1.SessionService", "IssueSession", "ok"), 1)

	// Guest connections: refused under DENY_ALL, carried under
	// PUBLIC_INTERNET.
	v4 := net.JoinHostPort(nettest.HostIPv4.String(), fmt.Sprint(e.v4.port))
	e.awaitApplied(1)
	refused := slot("refusals", "cause", "policy")
	if e.talk(v4) {
		t.Fatal("a connection left under DENY_ALL")
	}
	want("refusals by the policy", slot("refusals", "cause", "policy"), refused+1)
	e.setPolicy(public(nil))
	direct := slot("connections", "path", "direct")
	if !e.talk(v4) {
		t.Fatal("no connection under PUBLIC_INTERNET")
	}
	want("direct connections", slot("connections", "path", "direct"), direct+1)

	// DNS at the link address: the first lookup goes to the deployment
	// resolver, the second comes from the slot's cache (as would a retry).
	upstream, cached := slot("dns_queries", "answer", "upstream"), slot("dns_queries", "answer", "cache")
	for range 2 {
		if out, err := e.exec(e.ws, "nslookup", "-type=a", "internet.test"); err != nil {
			t.Fatalf("nslookup: %q, %v", out, err)
		}
	}
	want("DNS queries answered upstream", slot("dns_queries", "answer", "upstream"), upstream+1)
	if v := slot("dns_queries", "answer", "cache"); v < cached+1 {
		t.Errorf("DNS queries answered from the cache = %v, want at least %v", v, cached+1)
	}

	// An Egress whose endpoint nothing listens on.
	l, err := net.Listen("tcp4", nettest.UplinkIPv4.String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	egressID := e.createEgress(&ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: closed}}})
	want("CreateEgress ok", calls("ctrl.v1.EgressService", "CreateEgress", "ok"), 1)
	e.setPolicy(public(func(p *ctrlv1.NetworkPolicy) {
		p.Egresses = []*ctrlv1.NetworkPolicyEgress{{EgressId: egressID, Destinations: []string{nettest.HostIPv4.String()}}}
	}))
	unreachable := slot("refusals", "cause", "unreachable")
	if e.talk(v4) {
		t.Fatal("a connection went through an unreachable Egress")
	}
	want("connections lost to the Egress", slot("refusals", "cause", "unreachable"), unreachable+1)
	want("Egress faults", value("kibotos_host_egress_faults_total", append([]string{"kind", "endpoint_unreachable"}, host...)...), 1)

	// A Resolver that never answers.
	silent := e.inet.ListenPacket(t, "udp4", nettest.HostIPv4.String()+":0")
	resolverID := e.createResolver(udpResolver(silent.LocalAddr().String())).ResolverId
	e.resolveDirect(resolverID)
	if out, err := e.exec(e.ws, "nslookup", "internet.test"); err == nil {
		t.Fatalf("a silent Resolver answered: %q", out)
	}
	if v := value("kibotos_host_resolver_faults_total", append([]string{"kind", "upstream_timeout"}, host...)...); v < 1 {
		t.Errorf("Resolver timeouts = %v, want at least 1", v)
	}
	want("policy updates", calls("ctrl.v1.WorkspaceService", "UpdateWorkspaceNetworkPolicy", "ok"), 3)

	// Refused calls, by code.
	if _, err := unary(context.Background(), e.egresses.GetEgress, &ctrlv1.GetEgressRequest{EgressId: "missing"}); err == nil {
		t.Fatal("GetEgress of a missing Egress succeeded")
	}
	want("GetEgress not_found", calls("ctrl.v1.EgressService", "GetEgress", "not_found"), 1)
	anonymous, err := http.Post(e.url+"/kibotos.ctrl.v1.EgressService/ListEgresses", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	anonymous.Body.Close()
	want("ListEgresses unauthenticated", calls("ctrl.v1.EgressService", "ListEgresses", "unauthenticated"), 1)
}
