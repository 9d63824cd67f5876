package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/testutil"
)

// unanswering is a store that, once down, fails every transaction as a
// PostgreSQL server that does not answer does, its error naming the
// database's user, name and address.
type unanswering struct {
	store.Store
	down atomic.Bool
}

var errNoAnswer = fmt.Errorf("%w: postgres: begin: failed to connect to `user=kibotos database=kib`: 127.0.0.1:19101: connection refused", store.ErrUnavailable)

func (s *unanswering) Update(ctx context.Context, fn func(store.Tx) error) error {
	if s.down.Load() {
		return errNoAnswer
	}
	return s.Store.Update(ctx, fn)
}

func (s *unanswering) View(ctx context.Context, fn func(store.Tx) error) error {
	if s.down.Load() {
		return errNoAnswer
	}
	return s.Store.View(ctx, fn)
}

func (s *unanswering) ViewCached(ctx context.Context, fn func(store.Tx) error) error {
	if s.down.Load() {
		return errNoAnswer
	}
	return s.Store.ViewCached(ctx, fn)
}

// TestStoreDownIsOneAnswer: while the database does not answer, a call is
// unavailable with the one message the README gives, whether the token's
// check or the handler met it first, and never with the database's
// details.
func TestStoreDownIsOneAnswer(t *testing.T) {
	st := &unanswering{Store: testutil.SQLiteStore(t)}
	e := newEnv(t, st)
	projectID, _ := e.project("p", adminv1.Role_ROLE_EDITOR)
	unchecked := e.token(projectID, adminv1.Role_ROLE_EDITOR) // never used: its check reads the store
	e.createEgress(socks5("93.184.216.34:1080"), nil)         // the admin's token, checked and cached
	host := must[*connect.Response[adminv1.CreateHostTokenResponse]](t, "host token")(e.admins.CreateHostToken(context.Background(),
		connect.NewRequest(&adminv1.CreateHostTokenRequest{Name: "h", HostIds: []string{"h1"}}))).Msg.Secret
	st.down.Store(true)

	// Requests of unknown length are refused at the Gate, before any
	// handler: the same answer.
	for what, call := range map[string]struct{ procedure, token string }{
		"a stream's token, checked at the Gate": {"/kibotos.ctrl.v1.EgressService/ListEgresses", unchecked},
		"a host's token, checked at the Gate":   {"/kibotos.host.v1.HostService/ReportExecutions", host},
	} {
		req, err := http.NewRequest(http.MethodPost, e.url+call.procedure, io.NopCloser(strings.NewReader("{}")))
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = -1 // sent chunked
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+call.token)
		resp, body := testutil.Do(t, e.http, req)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "the control plane's database does not answer; retry shortly") ||
			strings.Contains(string(body), "user=") {
			t.Errorf("%s: %d %s, want unavailable with the README's message and no database details", what, resp.StatusCode, body)
		}
	}

	ready, err := e.http.Get(e.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	why, _ := io.ReadAll(ready.Body)
	ready.Body.Close()
	if ready.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(why), "store: the database does not answer") || strings.Contains(string(why), "user=") {
		t.Errorf("/readyz, which answers without a token: %d %s, want 503 saying the database does not answer, without its details", ready.StatusCode, why)
	}

	egress, _, _ := e.clients(unchecked)
	calls := map[string]error{}
	_, calls["a token checked against the store"] = egress.ListEgresses(context.Background(), connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
	_, calls["a cached token, the handler's read"] = e.egress.ListEgresses(context.Background(), connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
	_, calls["a cached token, the handler's write"] = e.egress.CreateEgress(context.Background(), connect.NewRequest(&ctrlv1.CreateEgressRequest{
		Command: cmd(), Spec: socks5("93.184.216.34:1080")}))
	for what, err := range calls {
		if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "the control plane's database does not answer; retry shortly") ||
			strings.Contains(err.Error(), "user=") {
			t.Errorf("%s: %v, want unavailable with the README's message and no database details", what, err)
		}
	}
}
