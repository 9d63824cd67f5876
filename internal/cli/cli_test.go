package cli

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// env is one test's control plane, an Egress in it, and a clean
// environment.
type env struct {
	srv    *ctrltest.Server
	addr   string
	home   string
	token  string         // the admin token of the operator project
	egress *ctrlv1.Egress // stored, with labels team=net and env=prod
	mark   int            // calls before the last command ran
}

// newEnv starts a control plane on loopback, stores an Egress, and clears
// the KIBOTOS_ variables, so that nothing on the machine (such as
// /var/lib/kibotos) leaks in.
func newEnv(t *testing.T) *env {
	t.Helper()
	srv := ctrltest.Start(t)
	egresses := ctrlv1connect.NewEgressServiceClient(srv.HTTP, srv.URL, connect.WithInterceptors(bearer.Token(srv.AdminToken)))
	resp, err := egresses.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: "setup"},
		Spec:    &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "proxy.example:1080"}}},
		Labels:  map[string]string{"team": "net", "env": "prod"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	home := cleanHome(t)
	return &env{srv: srv, addr: srv.URL, home: home, token: srv.AdminToken, egress: resp.Msg.GetEgress(), mark: len(srv.Calls())}
}

// newToken creates another admin token of the operator project.
func (e *env) newToken(t *testing.T) string {
	t.Helper()
	admin := adminv1connect.NewAdminServiceClient(e.srv.HTTP, e.srv.URL, connect.WithInterceptors(bearer.Token(e.token)))
	resp, err := admin.CreateToken(t.Context(), connect.NewRequest(&adminv1.CreateTokenRequest{Role: adminv1.Role_ROLE_ADMIN, Name: "test"}))
	if err != nil {
		t.Fatal(err)
	}
	e.mark = len(e.srv.Calls())
	return resp.Msg.GetSecret()
}

// list returns every Egress req selects, read with the admin token.
func (e *env) list(t *testing.T, req *ctrlv1.ListEgressesRequest) []*ctrlv1.Egress {
	t.Helper()
	var all []*ctrlv1.Egress
	for {
		page := e.listPage(t, req)
		all = append(all, page.GetEgresses()...)
		if page.GetNextPageToken() == "" {
			return all
		}
		req.PageToken = page.GetNextPageToken()
	}
}

// listPage returns one page of ListEgresses, read with the admin token.
func (e *env) listPage(t *testing.T, req *ctrlv1.ListEgressesRequest) *ctrlv1.ListEgressesResponse {
	t.Helper()
	egresses := ctrlv1connect.NewEgressServiceClient(e.srv.HTTP, e.srv.URL, connect.WithInterceptors(bearer.Token(e.token)))
	resp, err := egresses.ListEgresses(t.Context(), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Msg
}

// got returns what the last command sent: the method of each call, its
// Authorization header, and its request.
func (e *env) got() (calls, auth []string, reqs []proto.Message) {
	for _, c := range e.srv.Calls()[e.mark:] {
		calls = append(calls, c.Method)
		auth = append(auth, c.Authorization)
		reqs = append(reqs, c.Requests...)
	}
	return calls, auth, reqs
}

// run executes `kibotos args...` as cmd/kibotos would, with stdin.
func (e *env) run(t testing.TB, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return e.runIn(t.Context(), t, stdin, args...)
}

// runIn is run in ctx, whose end is the CLI's interrupt (SIGINT).
func (e *env) runIn(ctx context.Context, t testing.TB, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := &cobra.Command{Use: "kibotos", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(Commands()...)
	var out, errOut bytes.Buffer
	if e.srv != nil {
		e.mark = len(e.srv.Calls())
	}
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(stdin))
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// call runs a command with the admin token and wants success.
func (e *env) call(t testing.TB, stdin string, args ...string) (stdout, stderr string) {
	t.Helper()
	args = append(args, "--addr", e.addr, "--token", e.token)
	stdout, stderr, err := e.run(t, stdin, args...)
	if err != nil {
		t.Fatalf("kibotos %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr)
	}
	return stdout, stderr
}

// cleanHome empties the variables that name the CLI's server and token,
// and points its home at a fresh directory, which it returns.
func cleanHome(t testing.TB) string {
	home := t.TempDir()
	t.Setenv(envAddr, "")
	t.Setenv(envToken, "")
	t.Setenv(envHome, home)
	t.Setenv(envContext, "")
	t.Setenv("XDG_CONFIG_HOME", filepath.Join(home, "config"))
	t.Setenv(envSessionCache, filepath.Join(home, "sessions"))
	// Ages in tables count to a stopped clock, so tests can predict them.
	now := time.Now()
	clock = func() time.Time { return now }
	t.Cleanup(func() { clock = time.Now })
	return home
}

// callJSON runs call with args and decodes what it printed into resp,
// failing the test if that is not a resp.
func (e *env) callJSON(t testing.TB, resp proto.Message, args ...string) (stderr string) {
	t.Helper()
	stdout, stderr := e.call(t, "", args...)
	if err := protojson.Unmarshal([]byte(stdout), resp); err != nil {
		t.Fatalf("stdout is not a %s: %v\n%s", resp.ProtoReflect().Descriptor().Name(), err, stdout)
	}
	return stderr
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestEgressCreateSendsSpec(t *testing.T) {
	e := newEnv(t)
	pw := writeFile(t, "pw", "hunter2\n")
	_, caPEM := testtls.New(t, "proxy.example")
	ca := writeFile(t, "ca.pem", caPEM)
	e.call(t, "", "egress", "create", "--address", "proxy.example:1080",
		"--username", "alice", "--password-file", pw, "--ca-cert", ca, "--udp",
		"--label", "team=net", "--label", "env=prod", "--annotation", "note=a=b")

	calls, auth, reqs := e.got()
	if len(calls) != 1 || calls[0] != "CreateEgress" {
		t.Fatalf("calls = %v, want [CreateEgress]", calls)
	}
	if auth[0] != "Bearer "+e.token {
		t.Errorf("Authorization = %q, want %q", auth[0], "Bearer "+e.token)
	}
	req := reqs[0].(*ctrlv1.CreateEgressRequest)
	if req.GetCommand().GetCommandId() == "" {
		t.Error("command_id is empty")
	}
	want := &ctrlv1.CreateEgressRequest{
		Command: req.GetCommand(),
		Spec: &ctrlv1.EgressSpec{
			Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{
				Address:  "proxy.example:1080",
				Username: "alice",
				Password: "hunter2",
				Tls:      &ctrlv1.EgressTls{CaCert: caPEM},
			}},
			UdpEnabled: true,
		},
		Labels:      map[string]string{"team": "net", "env": "prod"},
		Annotations: map[string]string{"note": "a=b"},
	}
	if !proto.Equal(req, want) {
		t.Errorf("request = %v\nwant %v", req, want)
	}
}

func TestEgressCreatePasswordStdinAndCommandID(t *testing.T) {
	e := newEnv(t)
	e.call(t, "pa ss\r\n", "egress", "create", "--address", "proxy.example:1080", "--username", "u",
		"--password-stdin", "--tls", "--command-id", "retry-1")
	_, _, reqs := e.got()
	req := reqs[0].(*ctrlv1.CreateEgressRequest)
	if got := req.GetSpec().GetSocks5().GetPassword(); got != "pa ss" {
		t.Errorf("password = %q, want %q", got, "pa ss")
	}
	if req.GetSpec().GetSocks5().GetTls() == nil {
		t.Error("--tls did not set spec.socks5.tls")
	}
	if got := req.GetCommand().GetCommandId(); got != "retry-1" {
		t.Errorf("command_id = %q, want retry-1", got)
	}
}

func TestEgressCreateRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"password as flag", []string{"--password", "x"}, "unknown flag"},
		{"both password sources", []string{"--username", "u", "--password-file", "f", "--password-stdin"}, "password-file"},
		{"password without user", []string{"--password-stdin"}, "--username"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			args := append([]string{"egress", "create", "--address", "p:1", "--addr", e.addr, "--token", "t"}, tc.args...)
			_, _, err := e.run(t, "pw\n", args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if calls, _, _ := e.got(); len(calls) != 0 {
				t.Errorf("calls = %v, want none", calls)
			}
		})
	}
}

func TestTokenResolution(t *testing.T) {
	// Each source holds a different valid token; "%s" in a case stands for
	// the token of its source.
	for _, tc := range []struct {
		name      string
		flag      bool   // --token
		env       bool   // KIBOTOS_TOKEN
		homeFlag  bool   // admin-token under --home rather than KIBOTOS_HOME
		homeToken string // the admin-token file
		want      string // the source whose token is sent
	}{
		{name: "flag wins", flag: true, env: true, homeToken: "%s\n", want: "flag"},
		{name: "env over home", env: true, homeToken: "%s\n", want: "env"},
		{name: "home from env", homeToken: "%s\nsecond line\n", want: "home"},
		{name: "home from flag", homeFlag: true, homeToken: "  %s  \n", want: "home"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			tokens := map[string]string{"flag": e.newToken(t), "env": e.newToken(t), "home": e.newToken(t)}
			if tc.env {
				t.Setenv(envToken, tokens["env"])
			}
			home := e.home
			args := []string{"egress", "get", e.egress.GetEgressId(), "--addr", e.addr}
			if tc.homeFlag {
				home = t.TempDir()
				args = append(args, "--home", home)
			}
			if err := os.WriteFile(filepath.Join(home, adminTokenFile), []byte(fmt.Sprintf(tc.homeToken, tokens["home"])), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.flag {
				args = append(args, "--token", tokens["flag"])
			}
			if _, stderr, err := e.run(t, "", args...); err != nil {
				t.Fatalf("%v\nstderr: %s", err, stderr)
			}
			if _, auth, _ := e.got(); len(auth) != 1 || auth[0] != "Bearer "+tokens[tc.want] {
				t.Errorf("Authorization = %q, want the %s token", auth, tc.want)
			}
		})
	}
}

func TestMissingToken(t *testing.T) {
	e := newEnv(t) // KIBOTOS_TOKEN empty, KIBOTOS_HOME an empty directory
	_, _, err := e.run(t, "", "egress", "get", e.egress.GetEgressId(), "--addr", e.addr)
	if err == nil {
		t.Fatal("no error without a token")
	}
	for _, want := range []string{"--token", "KIBOTOS_TOKEN", "--home", "KIBOTOS_HOME", filepath.Join(e.home, "admin-token")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if calls, _, _ := e.got(); len(calls) != 0 {
		t.Errorf("calls = %v, want none", calls)
	}
}

func TestAddrFromEnvAcceptsHostPort(t *testing.T) {
	e := newEnv(t)
	t.Setenv(envAddr, strings.TrimPrefix(e.addr, "http://"))
	t.Setenv(envToken, e.token)
	if _, _, err := e.run(t, "", "egress", "get", e.egress.GetEgressId()); err != nil {
		t.Fatal(err)
	}
}

func TestPairErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"egress", "create", "--address", "p:1", "--label", "novalue"}, `--label "novalue"`},
		{[]string{"egress", "create", "--address", "p:1", "--annotation", "=v"}, `--annotation "=v": empty key`},
		{[]string{"egress", "create", "--address", "p:1", "--label", "a=1", "--label", "a=2"}, `key "a" given twice`},
		{[]string{"egress", "list", "--selector", "team"}, `--selector "team"`},
		{[]string{"egress", "label", "egr_1", "ok=1", "broken"}, `argument "broken"`},
		{[]string{"resolver", "create", "--udp", "10.0.0.1:53", "--label", "x"}, `--label "x"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			e := newEnv(t)
			_, _, err := e.run(t, "", append(tc.args, "--addr", e.addr, "--token", "t")...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %s", err, tc.want)
			}
			if calls, _, _ := e.got(); len(calls) != 0 {
				t.Errorf("calls = %v, want none", calls)
			}
		})
	}
	if m, err := parsePairs("--label", []string{"a=", "b=c=d"}); err != nil || m["a"] != "" || m["b"] != "c=d" {
		t.Errorf("parsePairs = %v, %v; want a empty, b=c=d", m, err)
	}
}

func TestTableOutput(t *testing.T) {
	e := newEnv(t)
	id := e.egress.GetEgressId()
	stdout, _ := e.call(t, "", "egress", "get", id)
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("output has %d lines, want header and one row:\n%s", len(lines), stdout)
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "ID ADDRESS TLS UDP REVISION LABELS AGE" {
		t.Errorf("header = %q", lines[0])
	}
	want := id + " proxy.example:1080 false false 1 env=prod,team=net " + age(e.egress.GetCreatedAt())
	if got := strings.Join(strings.Fields(lines[1]), " "); got != want {
		t.Errorf("row = %q, want %q", got, want)
	}
}

func TestJSONOutputParses(t *testing.T) {
	e := newEnv(t)
	var resp ctrlv1.CreateEgressResponse
	stderr := e.callJSON(t, &resp, "egress", "create", "--address", "proxy.example:1080", "-o", "json")
	if got := resp.GetEgress().GetSpec().GetSocks5().GetAddress(); got != "proxy.example:1080" {
		t.Errorf("address = %q", got)
	}
	_, _, reqs := e.got()
	id := reqs[0].(*ctrlv1.CreateEgressRequest).GetCommand().GetCommandId()
	if !strings.Contains(stderr, id) {
		t.Errorf("stderr %q does not report command_id %s", stderr, id)
	}

	// Without -o json nothing mentions the command ID.
	_, stderr = e.call(t, "", "egress", "create", "--address", "proxy.example:1080")
	if stderr != "" {
		t.Errorf("table mode wrote to stderr: %q", stderr)
	}
}

func TestListAllFollowsPages(t *testing.T) {
	e := newEnv(t)
	// Three Egresses carry team=net, a fourth does not.
	e.call(t, "", "egress", "create", "--address", "proxy.example:1081", "--label", "team=net")
	e.call(t, "", "egress", "create", "--address", "proxy.example:1082", "--label", "team=net")
	e.call(t, "", "egress", "create", "--address", "proxy.example:1083", "--label", "team=dns")
	all := e.list(t, &ctrlv1.ListEgressesRequest{LabelSelector: map[string]string{"team": "net"}})
	if len(all) != 3 {
		t.Fatalf("%d Egresses with team=net, want 3", len(all))
	}
	var resp ctrlv1.ListEgressesResponse
	e.callJSON(t, &resp, "egress", "list", "--all", "--page-size", "2", "--selector", "team=net", "-o", "json")
	if want := (&ctrlv1.ListEgressesResponse{Egresses: all}); !proto.Equal(&resp, want) {
		t.Errorf("list --all = %v, want %v", &resp, want)
	}
	_, _, reqs := e.got()
	if len(reqs) != 2 {
		t.Fatalf("%d calls, want 2", len(reqs))
	}
	if r := reqs[1].(*ctrlv1.ListEgressesRequest); r.GetPageToken() == "" || r.GetPageSize() != 2 || r.GetLabelSelector()["team"] != "net" {
		t.Errorf("second request = %v", r)
	}

	// Without --all: one page, and the token on stderr.
	stdout, stderr := e.call(t, "", "egress", "list", "--page-size", "2")
	if n := strings.Count(stdout, "\n"); n != 3 {
		t.Errorf("one page printed %d lines, want 3:\n%s", n, stdout)
	}
	page := e.listPage(t, &ctrlv1.ListEgressesRequest{PageSize: 2})
	if page.GetNextPageToken() == "" || !strings.Contains(stderr, page.GetNextPageToken()) {
		t.Errorf("stderr %q lacks the next page token", stderr)
	}
}

func TestUpdateReadsRevisionFirst(t *testing.T) {
	e := newEnv(t)
	id := e.egress.GetEgressId()
	e.call(t, "", "egress", "update", id, "--address", "new.example:1080", "--udp", "--drain-seconds", "0")
	calls, _, reqs := e.got()
	if strings.Join(calls, ",") != "GetEgress,UpdateEgress" {
		t.Fatalf("calls = %v, want GetEgress then UpdateEgress", calls)
	}
	req := reqs[1].(*ctrlv1.UpdateEgressRequest)
	if req.GetExpectedRevision() != e.egress.GetRevision() || req.GetEgressId() != id || req.GetCommand().GetCommandId() == "" {
		t.Errorf("update request = %v, want %s at revision %d with a command_id", req, id, e.egress.GetRevision())
	}
	if req.DrainSeconds == nil || *req.DrainSeconds != 0 {
		t.Errorf("drain_seconds = %v, want 0 (given)", req.DrainSeconds)
	}
	if !req.GetSpec().GetUdpEnabled() || req.GetSpec().GetSocks5().GetAddress() != "new.example:1080" {
		t.Errorf("spec = %v", req.GetSpec())
	}
}

func TestUpdateWithExpectedRevision(t *testing.T) {
	e := newEnv(t)
	e.call(t, "", "egress", "update", e.egress.GetEgressId(), "--address", "new.example:1080", "--expected-revision", "1")
	calls, _, reqs := e.got()
	if strings.Join(calls, ",") != "UpdateEgress" {
		t.Fatalf("calls = %v, want UpdateEgress alone", calls)
	}
	req := reqs[0].(*ctrlv1.UpdateEgressRequest)
	if req.GetExpectedRevision() != 1 || req.DrainSeconds != nil {
		t.Errorf("update request = %v, want revision 1 and no drain_seconds", req)
	}
}

func TestLabelReadsLabelsRevision(t *testing.T) {
	e := newEnv(t)
	id := e.egress.GetEgressId()
	e.call(t, "", "egress", "label", id, "team=dns")
	calls, _, reqs := e.got()
	if strings.Join(calls, ",") != "GetEgress,UpdateEgressLabels" {
		t.Fatalf("calls = %v", calls)
	}
	want := &ctrlv1.UpdateEgressLabelsRequest{
		Command:                reqs[1].(*ctrlv1.UpdateEgressLabelsRequest).GetCommand(),
		EgressId:               id,
		ExpectedLabelsRevision: e.egress.GetLabelsRevision(),
		Labels:                 map[string]string{"team": "dns"},
	}
	if !proto.Equal(reqs[1], want) {
		t.Errorf("request = %v, want %v", reqs[1], want)
	}

	if _, _, err := e.run(t, "", "egress", "label", id, "--addr", e.addr, "--token", e.token); err == nil {
		t.Error("label without pairs or --clear succeeded")
	}
}

func TestServerErrorFormat(t *testing.T) {
	e := newEnv(t)
	_, _, err := e.run(t, "", "egress", "get", "egr_missing", "--addr", e.addr, "--token", e.token)
	if want := `not_found: Egress "egr_missing" not found`; err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}

func TestResolverCreate(t *testing.T) {
	e := newEnv(t)
	_, caPEM := testtls.New(t, "dns.example")
	ca := writeFile(t, "ca.pem", caPEM)
	stdout, _ := e.call(t, "", "resolver", "create", "--tls", "dns.example:853", "--server-name", "dns.example", "--ca-cert", ca)
	_, _, reqs := e.got()
	want := &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tls{Tls: &ctrlv1.TlsResolver{Address: "dns.example:853", ServerName: "dns.example", CaCert: caPEM}}}
	if got := reqs[0].(*ctrlv1.CreateResolverRequest).GetSpec(); !proto.Equal(got, want) {
		t.Errorf("spec = %v, want %v", got, want)
	}
	if !strings.Contains(stdout, "PROTOCOL") || !strings.Contains(stdout, "tls") || !strings.Contains(stdout, "dns.example:853") {
		t.Errorf("table = %q", stdout)
	}

	for _, args := range [][]string{
		{"--udp", "a:53", "--tcp", "b:53"},
		{},
		{"--udp", "a:53", "--server-name", "x"},
	} {
		args = append([]string{"resolver", "create", "--addr", e.addr, "--token", "t"}, args...)
		if _, _, err := e.run(t, "", args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
}

func TestTokenCreatePrintsSecretLast(t *testing.T) {
	e := newEnv(t)
	stdout, stderr := e.call(t, "", "token", "create", "--role", "Editor", "--name", "ci")
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if !strings.Contains(lines[0], "ROLE") || !strings.Contains(lines[1], "editor") {
		t.Errorf("stdout = %q", stdout)
	}
	_, _, reqs := e.got()
	if r := reqs[0].(*adminv1.CreateTokenRequest); r.GetRole() != adminv1.Role_ROLE_EDITOR || r.GetName() != "ci" {
		t.Errorf("request = %v", r)
	}
	// The last line is the secret: it authenticates.
	if _, _, err := e.run(t, "", "egress", "get", e.egress.GetEgressId(), "--addr", e.addr, "--token", lines[len(lines)-1]); err != nil {
		t.Errorf("the last line %q is no working token: %v", lines[len(lines)-1], err)
	}
	if !strings.Contains(stderr, "once") {
		t.Errorf("stderr %q lacks the shown-once note", stderr)
	}
	if _, _, err := e.run(t, "", "token", "create", "--role", "root", "--addr", e.addr, "--token", "t"); err == nil {
		t.Error("--role root succeeded")
	}
}

// A server that does not listen is named, with how to start one.
func TestUnreachableServerHint(t *testing.T) {
	cleanHome(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	_, _, err = (&env{}).run(t, "", "ws", "list", "--addr", addr, "--token", "t")
	want := "cannot reach the Kibotos server at http://" + addr + ": is it running? (make up / kibotos up)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("ws list against a closed port: %v, want %q", err, want)
	}
	// Other failures are left as they are.
	e := newEnv(t)
	if _, _, err := e.run(t, "", "ws", "get", "ws_06h38fjb8dr6d00n3d7fkxjf2m", "--addr", e.addr, "--token", e.token); err == nil || strings.Contains(err.Error(), "cannot reach") {
		t.Fatalf("ws get of a missing workspace: %v", err)
	}
}

// TestRefusedEndpoint: a refused connection to another address than the
// server's is the host's that the server named, not the server's.
func TestRefusedEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = net.Dial("tcp", addr)
	if got := refusedAddr(err); got != addr {
		t.Fatalf("refusedAddr of %v: %q, want %q", err, got, addr)
	}
	for _, c := range []struct {
		base, refused string
		same          bool
	}{
		{"http://" + addr, addr, true},
		{"http://127.0.0.1:8870", "127.0.0.1:8871", false},
		{"http://127.0.0.1:8870", "10.0.0.7:8870", false},
		{"https://ctrl.example.com", "192.0.2.1:443", true}, // a name: it may be
		{"https://ctrl.example.com", "192.0.2.1:8871", false},
		{"http://[::1]:8870", "[::1]:8870", true},
	} {
		if got := sameEndpoint(c.base, c.refused); got != c.same {
			t.Errorf("sameEndpoint(%s, %s) = %v, want %v", c.base, c.refused, got, c.same)
		}
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	clock = func() time.Time { return now }
	t.Cleanup(func() { clock = time.Now })
	for ago, want := range map[time.Duration]string{
		0: "0s", 90 * time.Second: "90s", 5 * time.Minute: "5m", 119 * time.Minute: "119m", 3 * time.Hour: "3h",
		47 * time.Hour: "47h", 72 * time.Hour: "3d", 800 * 24 * time.Hour: "2y", -time.Hour: "0s",
	} {
		if got := age(timestamppb.New(now.Add(-ago))); got != want {
			t.Errorf("age of %v ago = %q, want %q", ago, got, want)
		}
	}
	if got := age(nil); got != "-" {
		t.Errorf("age(nil) = %q", got)
	}
}
