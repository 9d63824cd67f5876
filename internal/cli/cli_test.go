package cli

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
)

var created = timestamppb.New(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))

// fake serves the methods the tests call and records what it got.
type fake struct {
	ctrlv1connect.UnimplementedEgressServiceHandler
	ctrlv1connect.UnimplementedResolverServiceHandler
	adminv1connect.UnimplementedAdminServiceHandler

	mu      sync.Mutex
	calls   []string // procedure names, in order
	auth    []string // Authorization headers, in order
	reqs    []proto.Message
	egress  *ctrlv1.Egress                          // the one stored Egress
	pages   map[string]*ctrlv1.ListEgressesResponse // by page token
	created *ctrlv1.Resolver
}

func (f *fake) record(r connect.AnyRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r.Spec().Procedure[strings.LastIndex(r.Spec().Procedure, "/")+1:])
	f.auth = append(f.auth, r.Header().Get("Authorization"))
	f.reqs = append(f.reqs, r.Any().(proto.Message))
}

func (f *fake) CreateEgress(_ context.Context, r *connect.Request[ctrlv1.CreateEgressRequest]) (*connect.Response[ctrlv1.CreateEgressResponse], error) {
	f.record(r)
	e := &ctrlv1.Egress{EgressId: "egr_new", Spec: r.Msg.GetSpec(), Revision: 1, CreatedAt: created, Labels: r.Msg.GetLabels(), Annotations: r.Msg.GetAnnotations()}
	return connect.NewResponse(&ctrlv1.CreateEgressResponse{Egress: e}), nil
}

func (f *fake) GetEgress(_ context.Context, r *connect.Request[ctrlv1.GetEgressRequest]) (*connect.Response[ctrlv1.GetEgressResponse], error) {
	f.record(r)
	if r.Msg.GetEgressId() != f.egress.GetEgressId() {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("egress "+r.Msg.GetEgressId()+" not found"))
	}
	return connect.NewResponse(&ctrlv1.GetEgressResponse{Egress: f.egress}), nil
}

func (f *fake) ListEgresses(_ context.Context, r *connect.Request[ctrlv1.ListEgressesRequest]) (*connect.Response[ctrlv1.ListEgressesResponse], error) {
	f.record(r)
	return connect.NewResponse(f.pages[r.Msg.GetPageToken()]), nil
}

func (f *fake) UpdateEgress(_ context.Context, r *connect.Request[ctrlv1.UpdateEgressRequest]) (*connect.Response[ctrlv1.UpdateEgressResponse], error) {
	f.record(r)
	e := proto.CloneOf(f.egress)
	e.Spec, e.Revision = r.Msg.GetSpec(), e.GetRevision()+1
	return connect.NewResponse(&ctrlv1.UpdateEgressResponse{Egress: e}), nil
}

func (f *fake) UpdateEgressLabels(_ context.Context, r *connect.Request[ctrlv1.UpdateEgressLabelsRequest]) (*connect.Response[ctrlv1.UpdateEgressLabelsResponse], error) {
	f.record(r)
	e := proto.CloneOf(f.egress)
	e.Labels, e.LabelsRevision = r.Msg.GetLabels(), e.GetLabelsRevision()+1
	return connect.NewResponse(&ctrlv1.UpdateEgressLabelsResponse{Egress: e}), nil
}

func (f *fake) CreateResolver(_ context.Context, r *connect.Request[ctrlv1.CreateResolverRequest]) (*connect.Response[ctrlv1.CreateResolverResponse], error) {
	f.record(r)
	res := &ctrlv1.Resolver{ResolverId: "res_new", Spec: r.Msg.GetSpec(), Revision: 1, CreatedAt: created}
	return connect.NewResponse(&ctrlv1.CreateResolverResponse{Resolver: res}), nil
}

func (f *fake) CreateToken(_ context.Context, r *connect.Request[adminv1.CreateTokenRequest]) (*connect.Response[adminv1.CreateTokenResponse], error) {
	f.record(r)
	tok := &adminv1.Token{TokenId: "tok_1", ProjectId: "prj_1", Role: r.Msg.GetRole(), Name: r.Msg.GetName(), CreatedAt: created}
	return connect.NewResponse(&adminv1.CreateTokenResponse{Token: tok, Secret: "s3cret"}), nil
}

func (f *fake) got() (calls, auth []string, reqs []proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.auth, f.reqs
}

// env is one test's server and clean environment.
type env struct {
	f    *fake
	addr string
	home string
}

// newEnv starts the fake on loopback and clears the KIBOTOS_ variables, so
// that nothing on the machine (such as /var/lib/kibotos) leaks in.
func newEnv(t *testing.T) *env {
	t.Helper()
	f := &fake{egress: &ctrlv1.Egress{
		EgressId:       "egr_1",
		Spec:           &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "proxy.example:1080"}}},
		Revision:       7,
		LabelsRevision: 3,
		CreatedAt:      created,
		Labels:         map[string]string{"team": "net", "env": "prod"},
	}}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewEgressServiceHandler(f))
	mux.Handle(ctrlv1connect.NewResolverServiceHandler(f))
	mux.Handle(adminv1connect.NewAdminServiceHandler(f))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	home := t.TempDir()
	t.Setenv(envAddr, "")
	t.Setenv(envToken, "")
	t.Setenv(envHome, home)
	return &env{f: f, addr: srv.URL, home: home}
}

// run executes `kibotos args...` as cmd/kibotos would, with stdin.
func (e *env) run(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := &cobra.Command{Use: "kibotos", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(Commands()...)
	var out, errOut bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(stdin))
	err = root.ExecuteContext(t.Context())
	return out.String(), errOut.String(), err
}

// call runs a command against the fake with a token and wants success.
func (e *env) call(t *testing.T, stdin string, args ...string) (stdout, stderr string) {
	t.Helper()
	args = append(args, "--addr", e.addr, "--token", "tok")
	stdout, stderr, err := e.run(t, stdin, args...)
	if err != nil {
		t.Fatalf("kibotos %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr)
	}
	return stdout, stderr
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
	ca := writeFile(t, "ca.pem", "-----BEGIN CERTIFICATE-----\n")
	e.call(t, "", "egress", "create", "--address", "proxy.example:1080",
		"--username", "alice", "--password-file", pw, "--ca-cert", ca, "--udp",
		"--label", "team=net", "--label", "env=prod", "--annotation", "note=a=b")

	calls, auth, reqs := e.f.got()
	if len(calls) != 1 || calls[0] != "CreateEgress" {
		t.Fatalf("calls = %v, want [CreateEgress]", calls)
	}
	if auth[0] != "Bearer tok" {
		t.Errorf("Authorization = %q, want %q", auth[0], "Bearer tok")
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
				Tls:      &ctrlv1.EgressTls{CaCert: "-----BEGIN CERTIFICATE-----\n"},
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
	_, _, reqs := e.f.got()
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
			if calls, _, _ := e.f.got(); len(calls) != 0 {
				t.Errorf("calls = %v, want none", calls)
			}
		})
	}
}

func TestTokenResolution(t *testing.T) {
	for _, tc := range []struct {
		name      string
		flag      string // --token
		env       string // KIBOTOS_TOKEN
		homeFlag  bool   // admin-token under --home rather than KIBOTOS_HOME
		homeToken string
		want      string
	}{
		{name: "flag wins", flag: "from-flag", env: "from-env", homeToken: "from-home\n", want: "Bearer from-flag"},
		{name: "env over home", env: "from-env", homeToken: "from-home\n", want: "Bearer from-env"},
		{name: "home from env", homeToken: "from-home\nsecond line\n", want: "Bearer from-home"},
		{name: "home from flag", homeFlag: true, homeToken: "  from-home-flag  \n", want: "Bearer from-home-flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			t.Setenv(envToken, tc.env)
			home := e.home
			args := []string{"egress", "get", "egr_1", "--addr", e.addr}
			if tc.homeFlag {
				home = t.TempDir()
				args = append(args, "--home", home)
			}
			if err := os.WriteFile(filepath.Join(home, adminTokenFile), []byte(tc.homeToken), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.flag != "" {
				args = append(args, "--token", tc.flag)
			}
			if _, stderr, err := e.run(t, "", args...); err != nil {
				t.Fatalf("%v\nstderr: %s", err, stderr)
			}
			if _, auth, _ := e.f.got(); len(auth) != 1 || auth[0] != tc.want {
				t.Errorf("Authorization = %q, want %q", auth, tc.want)
			}
		})
	}
}

func TestMissingToken(t *testing.T) {
	e := newEnv(t) // KIBOTOS_TOKEN empty, KIBOTOS_HOME an empty directory
	_, _, err := e.run(t, "", "egress", "get", "egr_1", "--addr", e.addr)
	if err == nil {
		t.Fatal("no error without a token")
	}
	for _, want := range []string{"--token", "KIBOTOS_TOKEN", "--home", "KIBOTOS_HOME", filepath.Join(e.home, "admin-token")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if calls, _, _ := e.f.got(); len(calls) != 0 {
		t.Errorf("calls = %v, want none", calls)
	}
}

func TestAddrFromEnvAcceptsHostPort(t *testing.T) {
	e := newEnv(t)
	t.Setenv(envAddr, strings.TrimPrefix(e.addr, "http://"))
	t.Setenv(envToken, "tok")
	if _, _, err := e.run(t, "", "egress", "get", "egr_1"); err != nil {
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
			if calls, _, _ := e.f.got(); len(calls) != 0 {
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
	stdout, _ := e.call(t, "", "egress", "get", "egr_1")
	lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("output has %d lines, want header and one row:\n%s", len(lines), stdout)
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "ID ADDRESS TLS UDP REVISION LABELS CREATED" {
		t.Errorf("header = %q", lines[0])
	}
	want := "egr_1 proxy.example:1080 false false 7 env=prod,team=net 2025-03-01T12:00:00Z"
	if got := strings.Join(strings.Fields(lines[1]), " "); got != want {
		t.Errorf("row = %q, want %q", got, want)
	}
}

func TestJSONOutputParses(t *testing.T) {
	e := newEnv(t)
	stdout, stderr := e.call(t, "", "egress", "create", "--address", "proxy.example:1080", "-o", "json")
	var resp ctrlv1.CreateEgressResponse
	if err := protojson.Unmarshal([]byte(stdout), &resp); err != nil {
		t.Fatalf("stdout is not a CreateEgressResponse: %v\n%s", err, stdout)
	}
	if got := resp.GetEgress().GetSpec().GetSocks5().GetAddress(); got != "proxy.example:1080" {
		t.Errorf("address = %q", got)
	}
	_, _, reqs := e.f.got()
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
	a, b, c := &ctrlv1.Egress{EgressId: "egr_a"}, &ctrlv1.Egress{EgressId: "egr_b"}, &ctrlv1.Egress{EgressId: "egr_c"}
	e.f.pages = map[string]*ctrlv1.ListEgressesResponse{
		"":   {Egresses: []*ctrlv1.Egress{a, b}, NextPageToken: "p2"},
		"p2": {Egresses: []*ctrlv1.Egress{c}},
	}
	stdout, _ := e.call(t, "", "egress", "list", "--all", "--page-size", "2", "--selector", "team=net", "-o", "json")
	var resp ctrlv1.ListEgressesResponse
	if err := protojson.Unmarshal([]byte(stdout), &resp); err != nil {
		t.Fatal(err)
	}
	if want := (&ctrlv1.ListEgressesResponse{Egresses: []*ctrlv1.Egress{a, b, c}}); !proto.Equal(&resp, want) {
		t.Errorf("list --all = %v, want %v", &resp, want)
	}
	_, _, reqs := e.f.got()
	if len(reqs) != 2 {
		t.Fatalf("%d calls, want 2", len(reqs))
	}
	if r := reqs[1].(*ctrlv1.ListEgressesRequest); r.GetPageToken() != "p2" || r.GetPageSize() != 2 || r.GetLabelSelector()["team"] != "net" {
		t.Errorf("second request = %v", r)
	}

	// Without --all: one page, and the token on stderr.
	stdout, stderr := e.call(t, "", "egress", "list")
	if n := strings.Count(stdout, "\n"); n != 3 {
		t.Errorf("one page printed %d lines, want 3:\n%s", n, stdout)
	}
	if !strings.Contains(stderr, "p2") {
		t.Errorf("stderr %q lacks the next page token", stderr)
	}
}

func TestUpdateReadsRevisionFirst(t *testing.T) {
	e := newEnv(t)
	e.call(t, "", "egress", "update", "egr_1", "--address", "new.example:1080", "--udp", "--drain-seconds", "0")
	calls, _, reqs := e.f.got()
	if strings.Join(calls, ",") != "GetEgress,UpdateEgress" {
		t.Fatalf("calls = %v, want GetEgress then UpdateEgress", calls)
	}
	req := reqs[1].(*ctrlv1.UpdateEgressRequest)
	if req.GetExpectedRevision() != 7 || req.GetEgressId() != "egr_1" || req.GetCommand().GetCommandId() == "" {
		t.Errorf("update request = %v, want egr_1 at revision 7 with a command_id", req)
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
	e.call(t, "", "egress", "update", "egr_1", "--address", "new.example:1080", "--expected-revision", "3")
	calls, _, reqs := e.f.got()
	if strings.Join(calls, ",") != "UpdateEgress" {
		t.Fatalf("calls = %v, want UpdateEgress alone", calls)
	}
	req := reqs[0].(*ctrlv1.UpdateEgressRequest)
	if req.GetExpectedRevision() != 3 || req.DrainSeconds != nil {
		t.Errorf("update request = %v, want revision 3 and no drain_seconds", req)
	}
}

func TestLabelReadsLabelsRevision(t *testing.T) {
	e := newEnv(t)
	e.call(t, "", "egress", "label", "egr_1", "team=dns")
	calls, _, reqs := e.f.got()
	if strings.Join(calls, ",") != "GetEgress,UpdateEgressLabels" {
		t.Fatalf("calls = %v", calls)
	}
	want := &ctrlv1.UpdateEgressLabelsRequest{
		Command:                reqs[1].(*ctrlv1.UpdateEgressLabelsRequest).GetCommand(),
		EgressId:               "egr_1",
		ExpectedLabelsRevision: 3,
		Labels:                 map[string]string{"team": "dns"},
	}
	if !proto.Equal(reqs[1], want) {
		t.Errorf("request = %v, want %v", reqs[1], want)
	}

	if _, _, err := e.run(t, "", "egress", "label", "egr_1", "--addr", e.addr, "--token", "t"); err == nil {
		t.Error("label without pairs or --clear succeeded")
	}
}

func TestServerErrorFormat(t *testing.T) {
	e := newEnv(t)
	_, _, err := e.run(t, "", "egress", "get", "egr_missing", "--addr", e.addr, "--token", "t")
	if err == nil || err.Error() != "not_found: egress egr_missing not found" {
		t.Fatalf("err = %v, want not_found: egress egr_missing not found", err)
	}
}

func TestResolverCreate(t *testing.T) {
	e := newEnv(t)
	ca := writeFile(t, "ca.pem", "PEM")
	stdout, _ := e.call(t, "", "resolver", "create", "--tls", "dns.example:853", "--server-name", "dns.example", "--ca-cert", ca)
	_, _, reqs := e.f.got()
	want := &ctrlv1.ResolverSpec{Protocol: &ctrlv1.ResolverSpec_Tls{Tls: &ctrlv1.TlsResolver{Address: "dns.example:853", ServerName: "dns.example", CaCert: "PEM"}}}
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
	if lines[len(lines)-1] != "s3cret" || !strings.Contains(lines[0], "ROLE") || !strings.Contains(lines[1], "editor") {
		t.Errorf("stdout = %q", stdout)
	}
	if !strings.Contains(stderr, "once") {
		t.Errorf("stderr %q lacks the shown-once note", stderr)
	}
	_, _, reqs := e.f.got()
	if r := reqs[0].(*adminv1.CreateTokenRequest); r.GetRole() != adminv1.Role_ROLE_EDITOR || r.GetName() != "ci" {
		t.Errorf("request = %v", r)
	}
	if _, _, err := e.run(t, "", "token", "create", "--role", "root", "--addr", e.addr, "--token", "t"); err == nil {
		t.Error("--role root succeeded")
	}
}
