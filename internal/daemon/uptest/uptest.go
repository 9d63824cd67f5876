// Package uptest runs one whole deployment (`kibotos up`: the control
// plane and a host agent on runc) in the test process, shared by the tests
// of a package, for clients whose tests need workspaces and volumes to
// change state. Each test works in a project of its own, so tests see only
// their own objects.
//
// TestMain calls Main so that the deployment is stopped, and everything it
// ran removed, after the last test.
package uptest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testutil/registrytest"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// Deployment is the running deployment.
type Deployment struct {
	// URL is its base URL, http://127.0.0.1:port.
	URL string
	// Home is its home directory.
	Home string
	// AdminToken is the bootstrap admin token of the operator project.
	AdminToken string
	// Registry is the host:port of an image registry on loopback, without
	// auth, that the deployment pulls templates from over plain HTTP (its
	// loopback address exempt from the check of special-purpose addresses).
	Registry string

	registry *httptest.Server
	cancel   context.CancelFunc
	done     chan error
}

var (
	once     sync.Once
	shared   *Deployment
	startErr error
	tempDir  string
)

// Shared returns the package's deployment, started at the first call. It
// skips the test unless it runs as root with runc.
func Shared(t testing.TB) *Deployment {
	t.Helper()
	hosttest.RequireContainers(t)
	once.Do(func() { shared, startErr = start() })
	if startErr != nil {
		t.Fatal(startErr)
	}
	return shared
}

func start() (*Deployment, error) {
	dir, err := os.MkdirTemp("", "kibotos-uptest")
	if err != nil {
		return nil, err
	}
	tempDir = dir
	guest := filepath.Join(dir, "kibotos-guest")
	if err := testutil.Build(guest, testutil.GuestAgentPackage); err != nil {
		return nil, err
	}
	home := filepath.Join(dir, "home")
	ctx, cancel := context.WithCancel(context.Background())
	reg := httptest.NewServer(registrytest.Handler(false))
	d := &Deployment{Home: home, Registry: strings.TrimPrefix(reg.URL, "http://"), registry: reg, cancel: cancel, done: make(chan error, 1)}
	ready := make(chan net.Addr, 1)
	go func() {
		d.done <- daemon.Run(ctx, daemon.Options{Home: home, Listen: "127.0.0.1:0", Host: true, GuestAgent: guest,
			InsecureRegistries: []string{d.Registry}, UnsafeExemptRanges: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
			Ready: func(a net.Addr) { ready <- a }})
	}()
	select {
	case a := <-ready:
		d.URL = "http://" + a.String()
	case err := <-d.done:
		cancel()
		reg.Close()
		return nil, fmt.Errorf("kibotos up: %w", err)
	case <-time.After(60 * time.Second):
		cancel()
		reg.Close()
		return nil, fmt.Errorf("kibotos up did not start in 60s")
	}
	// The admin token file is written before the listener is ready.
	token, err := os.ReadFile(filepath.Join(home, "admin-token"))
	if err != nil {
		d.stop()
		return nil, err
	}
	d.AdminToken = strings.TrimSpace(string(token))
	return d, nil
}

// Main runs the tests, then stops the deployment if one was started and
// removes its files, and returns the exit code for os.Exit.
func Main(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		if err := shared.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "uptest:", err)
			code = 1
		}
	}
	if tempDir != "" {
		os.RemoveAll(tempDir)
	}
	return code
}

// stop stops the deployment. Each test deleted what it created.
func (d *Deployment) stop() error {
	d.cancel()
	defer d.registry.Close()
	if err := <-d.done; err != nil {
		return fmt.Errorf("kibotos up: %w", err)
	}
	return nil
}

// clean deletes a project's workspaces, then its volumes, and waits until
// each is DELETED.
func (d *Deployment) clean(ctx context.Context, token string) error {
	opt := connect.WithInterceptors(bearer.Token(token))
	wss := ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, d.URL, opt)
	vols := ctrlv1connect.NewVolumeServiceClient(http.DefaultClient, d.URL, opt)
	list, err := wss.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{PageSize: 1000}))
	if err != nil {
		return err
	}
	for _, ws := range list.Msg.GetWorkspaces() {
		wss.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: command(), WorkspaceId: ws.GetWorkspaceId()}))
	}
	if err := until(ctx, func() (bool, error) {
		list, err := wss.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{PageSize: 1000}))
		for _, ws := range list.Msg.GetWorkspaces() {
			if ws.GetState() != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
				return false, err
			}
		}
		return true, err
	}); err != nil {
		return fmt.Errorf("deleting workspaces: %w", err)
	}
	vl, err := vols.ListVolumes(ctx, connect.NewRequest(&ctrlv1.ListVolumesRequest{PageSize: 1000}))
	if err != nil {
		return err
	}
	for _, v := range vl.Msg.GetVolumes() {
		vols.DeleteVolume(ctx, connect.NewRequest(&ctrlv1.DeleteVolumeRequest{Command: command(), VolumeId: v.GetVolumeId()}))
	}
	return until(ctx, func() (bool, error) {
		vl, err := vols.ListVolumes(ctx, connect.NewRequest(&ctrlv1.ListVolumesRequest{PageSize: 1000}))
		for _, v := range vl.Msg.GetVolumes() {
			if v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
				return false, err
			}
		}
		return true, err
	})
}

// until polls done every 100 ms until it holds or ctx ends.
func until(ctx context.Context, done func() (bool, error)) error {
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func command() *ctrlv1.CommandMetadata {
	return &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}
}

// Project creates a project of its own for one test and returns an admin
// token of it. When the test ends, every workspace and volume of the
// project is deleted, so that no container, mount or loop device outlives
// it.
func (d *Deployment) Project(t testing.TB) string {
	t.Helper()
	admin := adminv1connect.NewAdminServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(d.AdminToken)))
	p, err := admin.CreateProject(t.Context(), connect.NewRequest(&adminv1.CreateProjectRequest{Name: "t-" + uuid.NewString()[:8]}))
	if err != nil {
		t.Fatal(err)
	}
	token, err := admin.CreateToken(t.Context(), connect.NewRequest(&adminv1.CreateTokenRequest{
		ProjectId: p.Msg.GetProject().GetProjectId(), Role: adminv1.Role_ROLE_ADMIN, Name: t.Name()}))
	if err != nil {
		t.Fatal(err)
	}
	secret := token.Msg.GetSecret()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := d.clean(ctx, secret); err != nil {
			t.Errorf("cleaning up the test's project: %v", err)
		}
	})
	return secret
}
