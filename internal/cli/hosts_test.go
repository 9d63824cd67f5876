package cli

import (
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestHostRowSizes: a host's capacity is measured, so its row shows it
// to a tenth of its unit, and a host with nothing reserved shows 0.
func TestHostRowSizes(t *testing.T) {
	h := &adminv1.Host{
		HostId:   "rack-1-a",
		Capacity: &adminv1.HostResources{CpuMillis: 8000, MemoryBytes: 24683784 << 10, LayerBytes: 69187352 << 10},
		Reserved: &adminv1.HostResources{CpuMillis: 1000, MemoryBytes: 512 << 20},
	}
	row := hostTable.row(h)
	got := row[3:6]
	if want := []string{"1000m/8000m", "512.0Mi/23.5Gi", "0/66.0Gi"}; !slices.Equal(got, want) {
		t.Errorf("CPU, MEMORY, LAYERS = %q, want %q", got, want)
	}
}

// TestHostTokenCreateNamesItsHosts: `admin host-token create --host`
// issues a token that registers those hosts only, which `list` shows, and
// a token for any host takes --any-host: one or the other is required.
func TestHostTokenCreateNamesItsHosts(t *testing.T) {
	e := newEnv(t)
	stdout, _ := e.call(t, "", "admin", "host-token", "create", "--name", "rack 1", "--host", "rack-1-b", "--host", "rack-1-a")
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if !strings.Contains(lines[1], " rack-1-a,rack-1-b ") {
		t.Errorf("stdout = %q, want the token's row to show its hosts", stdout)
	}
	register := func(host string) error {
		hosts := hostv1connect.NewHostServiceClient(e.srv.HTTP, e.srv.URL, connect.WithInterceptors(bearer.Token(lines[len(lines)-1])))
		_, err := hosts.RegisterHost(t.Context(), connect.NewRequest(&hostv1.RegisterHostRequest{HostId: host,
			Capacity: &hostv1.HostCapacity{CpuMillis: 1000, MemoryBytes: 1 << 30, LayerBytes: 1 << 30}}))
		return err
	}
	if err := register("rack-1-a"); err != nil {
		t.Errorf("registering a host of the token: %v", err)
	}
	if err := register("made-up"); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("registering another host: %v, want permission_denied", err)
	}

	e.call(t, "", "admin", "host-token", "create", "--any-host")
	var list adminv1.ListHostTokensResponse
	e.callJSON(t, &list, "admin", "host-token", "list", "-o", "json")
	stdout, _ = e.call(t, "", "admin", "host-token", "list")
	for _, tok := range list.GetHostTokens() {
		want := "rack-1-a,rack-1-b"
		if tok.GetAnyHost() {
			want = "(any)"
		}
		if !strings.Contains(stdout, tok.GetHostTokenId()+" ") || !strings.Contains(stdout, " "+want+" ") {
			t.Errorf("list = %q, want %s with HOSTS %s", stdout, tok.GetHostTokenId(), want)
		}
	}
	if len(list.GetHostTokens()) != 2 {
		t.Errorf("list = %v, want the two tokens", list.GetHostTokens())
	}

	for _, args := range [][]string{{"--name", "n"}, {"--host", "h1", "--any-host"}} {
		_, _, err := e.run(t, "", append([]string{"admin", "host-token", "create", "--addr", e.addr, "--token", e.token}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "any-host") {
			t.Errorf("create %q: %v, want --host or --any-host asked for", args, err)
		}
		if calls, _, _ := e.got(); len(calls) != 0 {
			t.Errorf("create %q called %v, want nothing", args, calls)
		}
	}
}
