package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/buildinfo"
	"github.com/kibotos/kibotos/internal/ctrl/accesslog"
	"github.com/kibotos/kibotos/internal/ctrl/health"
	"github.com/kibotos/kibotos/internal/ctrl/registry"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// logLines returns the JSON log lines written to log so far, each decoded.
func logLines(t *testing.T, log *testutil.SyncBuffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %v: %s", err, l)
		}
		out = append(out, m)
	}
	return out
}

type opsServer struct {
	url   string
	token string
	store store.Store
	log   *testutil.SyncBuffer
}

// panicPuller fails every pull with a panic, the server's bug.
type panicPuller struct{}

func (panicPuller) Pull(context.Context, string, v1.Platform, registry.Credentials) (v1.Image, error) {
	panic("a bug in the puller")
}

// startOps runs a control plane on a SQLite store with a JSON logger.
func startOps(t *testing.T) *opsServer {
	t.Helper()
	return startOpsOn(t, testutil.SQLiteStore(t))
}

// startOpsOn runs a control plane on st with a JSON logger.
func startOpsOn(t *testing.T, st store.Store) *opsServer {
	t.Helper()
	buf := &testutil.SyncBuffer{}
	ctl, token := ctrltest.New(t, st, server.Config{Checker: &netcheck.Checker{}, HostToken: "host", Registry: panicPuller{},
		Logger: slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	srv := httptest.NewServer(ctl.Handler)
	t.Cleanup(srv.Close)
	return &opsServer{url: srv.URL, token: token, store: st, log: buf}
}

// get sends GET url and returns the status and the body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, b := testutil.Do(t, http.DefaultClient, req)
	return resp.StatusCode, string(b)
}

// /healthz answers while the process serves; /readyz only while the store
// answers, with the reason otherwise; neither needs a token.
func TestHealthAndReadiness(t *testing.T) {
	for name, open := range map[string]func(testing.TB) store.Store{"sqlite": testutil.SQLiteStore, "postgres": testutil.PostgresStore} {
		t.Run(name, func(t *testing.T) { testHealthAndReadiness(t, startOpsOn(t, open(t))) })
	}
}

func testHealthAndReadiness(t *testing.T, s *opsServer) {
	if code, body := get(t, s.url+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := get(t, s.url+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("/readyz = %d %q", code, body)
	}
	s.store.Close()
	if code, body := get(t, s.url+"/readyz"); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not ready: store: ") {
		t.Errorf("/readyz with the store closed = %d %q", code, body)
	}
	if code, _ := get(t, s.url+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with the store closed = %d", code)
	}
}

// A readiness check of the process's own fails /readyz with its name.
func TestReadinessChecks(t *testing.T) {
	ctx := context.Background()
	st := testutil.SQLiteStore(t)
	var registered atomic.Bool
	ctl, err := server.New(ctx, server.Config{Store: st, Checker: &netcheck.Checker{}, Ready: []health.Check{{Name: "host",
		Func: func(context.Context) error {
			if !registered.Load() {
				return errors.New("not registered")
			}
			return nil
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ctl.Handler)
	defer srv.Close()
	if code, body := get(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || body != "not ready: host: not registered\n" {
		t.Errorf("/readyz = %d %q", code, body)
	}
	registered.Store(true)
	if code, _ := get(t, srv.URL+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz once registered = %d", code)
	}
}

// Each call is one JSON log line with its method, code, latency, project
// and request id, the id the response's X-Request-Id header carries; an
// internal error gives the caller that id and logs the cause with it.
func TestAccessLog(t *testing.T) {
	s := startOps(t)
	ctx := context.Background()
	templates := ctrlv1connect.NewTemplateServiceClient(http.DefaultClient, s.url, connect.WithInterceptors(bearer.Token(s.token)))
	resp, err := templates.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	okID := resp.Header().Get(accesslog.Header)
	_, err = templates.GetTemplate(ctx, connect.NewRequest(&ctrlv1.GetTemplateRequest{TemplateId: "missing"}))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound {
		t.Fatalf("GetTemplate of a missing template: %v", err)
	}
	missingID := ce.Meta().Get(accesslog.Header)
	if len(okID) != 16 || len(missingID) != 16 || okID == missingID {
		t.Fatalf("request ids %q and %q, want two different ones", okID, missingID)
	}

	// A panic in a handler is an internal error.
	if _, err := templates.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: "c1"}, TemplateId: "app"})); err != nil {
		t.Fatal(err)
	}
	stream := templates.ImportTemplateRevision(ctx)
	stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Start{Start: &ctrlv1.ImportTemplateRevisionStart{
		Command: &ctrlv1.CommandMetadata{CommandId: "c2"}, TemplateId: "app",
		Source: &ctrlv1.ImportTemplateRevisionStart_RegistryReference{RegistryReference: "registry.example.com/app:1"}}}})
	_, err = stream.CloseAndReceive()
	if !errors.As(err, &ce) || ce.Code() != connect.CodeInternal {
		t.Fatalf("an import whose puller panics: %v", err)
	}
	internalID := ce.Meta().Get(accesslog.Header)
	if want := "internal error; see the server log (request id " + internalID + ")"; ce.Message() != want {
		t.Errorf("internal error says %q, want %q", ce.Message(), want)
	}

	byID := map[string][]map[string]any{}
	for _, l := range logLines(t, s.log) {
		if id, ok := l["request_id"].(string); ok {
			byID[id] = append(byID[id], l)
		}
	}
	check := func(id, method, code string, project bool) {
		t.Helper()
		var call map[string]any
		for _, l := range byID[id] {
			if l["msg"] == "call" {
				if call != nil {
					t.Errorf("request %s has two call lines", id)
				}
				call = l
			}
		}
		if call == nil {
			t.Fatalf("no call line for request %s: %v", id, byID)
		}
		if call["method"] != method || call["code"] != code || call["level"] != "INFO" {
			t.Errorf("call line %v, want method %s code %s at INFO", call, method, code)
		}
		if _, ok := call["latency"].(float64); !ok {
			t.Errorf("call line %v has no latency", call)
		}
		if p, _ := call["project"].(string); (p != "") != project {
			t.Errorf("call line %v: project %q", call, p)
		}
	}
	check(okID, ctrlv1connect.TemplateServiceListTemplatesProcedure, "ok", true)
	check(missingID, ctrlv1connect.TemplateServiceGetTemplateProcedure, "not_found", true)
	check(internalID, ctrlv1connect.TemplateServiceImportTemplateRevisionProcedure, "internal", true)
	var cause string
	for _, l := range byID[internalID] {
		if l["msg"] == "internal error" && l["level"] == "ERROR" {
			cause, _ = l["err"].(string)
		}
	}
	if !strings.Contains(cause, "a bug in the puller") {
		t.Errorf("the internal error's cause is not logged with its request id: %v", byID[internalID])
	}
}

// /metrics carries the build as kibotos_build_info.
func TestBuildInfoMetric(t *testing.T) {
	s := startOps(t)
	_, body := get(t, s.url+"/metrics")
	b := buildinfo.Get()
	want := `kibotos_build_info{commit="` + b.Commit + `",go_version="` + b.GoVersion + `",version="` + b.Version + `"} 1`
	if !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %s", want)
	}
}
