package server_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// TestRevokedTokenUnderLoad revokes a token while 64 callers use it, as
// another ctrl replica would (in the shared store, so this server's cache
// is not told): every call that starts once the cache period has passed
// is unauthenticated, and no call fails any other way.
func TestRevokedTokenUnderLoad(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		_, token := e.project("busy", adminv1.Role_ROLE_EDITOR)
		tokenID, _, _ := strings.Cut(token, ".")
		client, _, _ := e.clients(token)
		eg, err := client.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: cmd(), Spec: socks5("93.184.216.34:1080")}))
		if err != nil {
			t.Fatal(err)
		}

		type call struct {
			start time.Time
			code  connect.Code // 0 for success
		}
		var (
			cutoff time.Time // set before cut closes
			cut    = make(chan struct{})
			wg     sync.WaitGroup
			calls  = make([][]call, 64)
		)
		for i := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Call until a call that started after the cache period
				// has been answered.
				for {
					select {
					case <-cut:
						if n := len(calls[i]); n > 0 && calls[i][n-1].start.After(cutoff) {
							return
						}
					default:
					}
					start := time.Now()
					_, err := client.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: eg.Msg.Egress.EgressId}))
					c := call{start: start}
					if err != nil {
						c.code = connect.CodeOf(err)
					}
					calls[i] = append(calls[i], c)
				}
			}()
		}
		time.Sleep(200 * time.Millisecond)
		if err := e.store.Update(ctx, func(tx store.Tx) error { return tx.RevokeToken(ctx, tokenID, time.Now()) }); err != nil {
			t.Fatal(err)
		}
		revoked := time.Now() // the revocation has committed
		cutoff = revoked.Add(auth.DefaultCacheTTL)
		close(cut)
		wg.Wait()

		var before, after int
		for i, cs := range calls {
			late := 0
			for _, c := range cs {
				switch {
				case c.code != 0 && c.code != connect.CodeUnauthenticated:
					t.Errorf("caller %d: a call failed with %v", i, c.code)
				case c.start.After(cutoff) && c.code != connect.CodeUnauthenticated:
					t.Errorf("caller %d: a call started %v after the revocation succeeded", i, c.start.Sub(revoked))
				case c.start.After(cutoff):
					late++
				case c.start.Before(revoked) && c.code == 0:
					before++
				}
			}
			after += late
		}
		if before == 0 {
			t.Error("no call succeeded before the revocation")
		}
		t.Logf("%d calls succeeded before the revocation, %d after the cache period were refused", before, after)
	})
}

// TestRevokedTokenEndsItsWatch revokes a token, as another ctrl replica
// would, while a WatchWorkspace of it is open: the stream ends
// unauthenticated, within the cache period and a recheck, instead of
// sending the workspace's changes on to a revoked caller.
func TestRevokedTokenEndsItsWatch(t *testing.T) {
	backends(t, func(t *testing.T, e *env) {
		e.workspaces() // a host and the default template
		projectID, token := e.project("watched", adminv1.Role_ROLE_VIEWER)
		tokenID, _, _ := strings.Cut(token, ".")
		editor := ctrlv1connect.NewWorkspaceServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(e.token(projectID, adminv1.Role_ROLE_EDITOR))))
		viewer := ctrlv1connect.NewWorkspaceServiceClient(e.http, e.url, connect.WithInterceptors(bearer.Token(token)))
		id := newWorkspace(t, editor)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		watch, err := viewer.WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			t.Fatal(err)
		}
		defer watch.Close()
		if !watch.Receive() {
			t.Fatalf("the watch's first message: %v", watch.Err())
		}
		if err := e.store.Update(ctx, func(tx store.Tx) error { return tx.RevokeToken(ctx, tokenID, time.Now()) }); err != nil {
			t.Fatal(err)
		}
		for watch.Receive() {
		}
		if connect.CodeOf(watch.Err()) != connect.CodeUnauthenticated {
			t.Fatalf("the watch of a revoked token ended with %v, want unauthenticated", watch.Err())
		}
	})
}
