// Package ctrltest runs the real control plane in-process for tests of its
// clients (the CLI, the SDK) and of its API surface: the handlers of
// internal/ctrl/server over a fresh SQLite store and image store, served on
// loopback, with the deployment's bootstrap admin token. Hostname lookups
// are answered from a table, so nothing leaves the machine.
//
// The server records every call it is sent (procedure, Authorization header
// and decoded request messages) before the handlers see it, so a client's
// test can check what the client sent, and Snapshot reads every row of the
// store, so a test can check that a call changed nothing.
//
// New and Serve are its two halves for tests that need another store or
// configuration: a control plane assembled on a bootstrapped store, and a
// handler served on loopback as the ctrl process serves it.
package ctrltest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"gocloud.dev/blob/memblob"

	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/store/sqlite"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/internal/testutil/fakeresolver"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// HostToken is the secret the server's host API accepts.
const HostToken = "ctrltest-host-token"

// Hosts are the hostnames the server's resolver knows, each with a public
// documentation address unless its name says otherwise.
var Hosts = map[string][]netip.Addr{
	"proxy.example":        {netip.MustParseAddr("93.184.216.34")},
	"proxy.example.com":    {netip.MustParseAddr("93.184.216.34")},
	"dns.example":          {netip.MustParseAddr("9.9.9.9")},
	"dns.example.com":      {netip.MustParseAddr("9.9.9.9")},
	"new.example":          {netip.MustParseAddr("93.184.216.35")},
	"internal.example.com": {netip.MustParseAddr("10.1.2.3")},
}

// Server is a control plane serving on loopback for one test.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:port.
	URL string
	// AdminToken is the bootstrap admin token of the operator project.
	AdminToken string
	// Store is the server's store.
	Store store.Store
	// Control is the assembled control plane.
	Control *server.Control
	// HTTP is a client for the server: HTTP/1.1 and cleartext HTTP/2.
	HTTP *http.Client

	dbPath string
	images *imagestore.Store
	calls  *recorder
}

// Start runs a control plane until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "kibotos.db")
	st, err := sqlite.Open(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	images, err := imagestore.Open(filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	blobs := memblob.OpenBucket(nil)
	t.Cleanup(func() { blobs.Close() })
	control, admin := New(t, st, server.Config{
		Checker:   &netcheck.Checker{Resolver: fakeresolver.New(Hosts)},
		Images:    images,
		HostToken: HostToken,
		Blobs:     blobs,
	})
	rec := &recorder{next: control.Handler}
	url, client := Serve(t, rec)
	return &Server{
		URL:        url,
		AdminToken: admin,
		Store:      st,
		Control:    control,
		HTTP:       client,
		dbPath:     dbPath,
		images:     images,
		calls:      rec,
	}
}

// Calls returns the calls the server was sent so far, oldest first.
func (s *Server) Calls() []Call { return s.calls.all() }

// Methods returns the method name of each call so far, oldest first.
func (s *Server) Methods() []string {
	var names []string
	for _, c := range s.Calls() {
		names = append(names, c.Method)
	}
	return names
}

// Snapshot returns every row of every table of the store, one string a row,
// by table. Two snapshots are equal when nothing was stored in between.
func (s *Server) Snapshot(t testing.TB) map[string][]string {
	t.Helper()
	return SnapshotSQLite(t, s.dbPath)
}

// SnapshotSQLite is Snapshot of the SQLite store at path (a deployment's
// $KIBOTOS_HOME/kibotos.db).
func SnapshotSQLite(t testing.TB, path string) map[string][]string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+url.PathEscape(path)+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	rows, err := db.QueryContext(ctx, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, name)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	snap := make(map[string][]string, len(tables))
	for _, table := range tables {
		snap[table] = tableRows(t, db, table)
	}
	return snap
}

func tableRows(t testing.TB, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT * FROM "` + table + `" ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		values := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range values {
			ptrs[i] = &values[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		fields := make([]string, len(values))
		for i, v := range values {
			fields[i] = fmt.Sprintf("%s=%v", cols[i], v)
		}
		out = append(out, strings.Join(fields, " "))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// RegisterHost registers a host that never reports, with room for every
// workspace a test creates: workspaces are placed on it and stay in the
// state they were created in.
func (s *Server) RegisterHost(t testing.TB, id string) {
	t.Helper()
	hosts := hostv1connect.NewHostServiceClient(s.HTTP, s.URL, connect.WithInterceptors(bearer.Token(HostToken)))
	if _, err := hosts.RegisterHost(t.Context(), connect.NewRequest(&hostv1.RegisterHostRequest{HostId: id, Capacity: &hostv1.HostCapacity{
		CpuMillis: 64000, MemoryBytes: 256 << 30, LayerBytes: 4 << 40, DefaultLayerBytes: 1 << 30,
	}})); err != nil {
		t.Fatal(err)
	}
}

// AddBuiltinTemplate stores the built-in template base, made of the
// machine's busybox, as `kibotos up` does. It skips the test when busybox
// is missing.
func (s *Server) AddBuiltinTemplate(t testing.TB) {
	t.Helper()
	hosttest.RequireBusybox(t)
	if err := templates.EnsureBuiltin(t.Context(), s.Store, s.images, hosttest.Busybox); err != nil {
		t.Fatal(err)
	}
}

// New bootstraps st as a deployment's first start does and assembles a
// control plane on it with cfg, its Store set to st and, unless cfg names
// one, a new image store; the plane's background work ends with the test.
// It returns the plane and the bootstrap admin token.
func New(t testing.TB, st store.Store, cfg server.Config) (*server.Control, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	admin, err := auth.Bootstrap(ctx, st, time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Images == nil {
		if cfg.Images, err = imagestore.Open(t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Store = st
	control, err := server.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return control, admin
}

// Serve serves h with server.Serve, as the ctrl process does, on a
// loopback listener until the test ends, and returns its base URL
// (http://127.0.0.1:port) and a client for it (HTTP/1.1 and cleartext
// HTTP/2). It stops before the cleanups registered earlier run.
func Serve(t testing.TB, h http.Handler) (string, *http.Client) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- server.Serve(ctx, ln, h, 5*time.Second) }()
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: &protocols}}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String(), client
}
