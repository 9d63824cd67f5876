package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// module is this module's path.
const module = "github.com/kibotos/kibotos/"

// allowedImport reports whether the guest agent may link package p (a
// package outside the standard library): the agent is PID 1 of every
// guest, static and small, so SQL, gVisor, registries and CLI frameworks
// stay out.
func allowedImport(p string) bool {
	under := func(root string) bool { return p == root || strings.HasPrefix(p, root+"/") }
	switch {
	case under(module + "gen"),
		under(module + "internal/guest"),
		under(module + "internal/guestabi"),
		under(module + "sdk/failure"),
		// Moving a copied tree into place (the standard library only).
		under(module + "internal/treemove"),
		under("golang.org/x/sys"),
		under("golang.org/x/net"),
		under("connectrpc.com/connect"),
		under("google.golang.org/protobuf"),
		under("github.com/creack/pty"),
		under("github.com/fsnotify/fsnotify"),
		// The X11 protocol, for the display's screen and input.
		under("github.com/jezek/xgb"):
		return true
	}
	return false
}

// TestImportFence keeps the guest agent small: only the packages
// allowedImport names may be linked in, and it must build without cgo.
func TestImportFence(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list found no dependencies")
	}
	for _, p := range deps {
		if p != strings.TrimSuffix(module, "/")+"/cmd/kibotos-guest" && !allowedImport(p) {
			t.Errorf("kibotos-guest depends on %s, which the import fence does not allow", p)
		}
	}
}

func TestAllowedImport(t *testing.T) {
	for _, p := range []string{
		module + "gen/kibotos/data/v1",
		module + "gen/kibotos/data/v1/datav1connect",
		module + "internal/guest/dataplane",
		module + "internal/guest/pid1",
		module + "internal/guestabi",
		module + "sdk/failure",
		"golang.org/x/sys/unix",
		"golang.org/x/net/http2",
		"connectrpc.com/connect",
		"connectrpc.com/connect/internal/gen/connectext/grpc/status/v1",
		"google.golang.org/protobuf/proto",
		"github.com/creack/pty",
		"github.com/fsnotify/fsnotify/internal",
		"github.com/jezek/xgb",
		"github.com/jezek/xgb/xproto",
	} {
		if !allowedImport(p) {
			t.Errorf("%s refused", p)
		}
	}
	for _, p := range []string{
		"modernc.org/sqlite",
		"github.com/jackc/pgx/v5",
		"github.com/jackc/pgx/v5/pgconn",
		"gvisor.dev/gvisor/pkg/tcpip",
		"github.com/spf13/cobra",
		"github.com/google/go-containerregistry/pkg/v1",
		"connectrpc.com/grpcreflect",
		"connectrpc.com/connectx",
		"golang.org/x/sync/errgroup",
		"golang.org/x/netx",
		module + "internal/ctrl/store",
		module + "internal/errdetail",
		module + "sdk",
		module + "internal/guestfoo",
		module + "internal/imagestore",
		module + "internal/host/runtime/oci",
		module + "cmd/kibotos",
		"github.com/creack/ptyx",
		"github.com/jezek/xgbutil",
	} {
		if allowedImport(p) {
			t.Errorf("%s allowed", p)
		}
	}
}
