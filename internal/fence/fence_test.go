package fence

import (
	"errors"
	"go/build"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/kibotos/kibotos"

// Parts of the module, by the path prefix that holds them.
const (
	ctrl   = "ctrl"   // the control plane
	host   = "host"   // what runs on each host
	guest  = "guest"  // what runs inside a guest
	leaf   = "leaf"   // small packages every plane may share
	client = "client" // the SDK and the CLI, clients of the public API
	wiring = "wiring" // mains and the deployment that joins the planes
	gen    = "gen"    // generated from proto/
	test   = "test"   // helpers of tests only
)

// parts maps each module path prefix to its part; the longest prefix wins.
var parts = map[string]string{
	"internal/ctrl":        ctrl,
	"internal/host":        host,
	"internal/guest":       guest,
	"cmd/kibotos-guest":    guest,
	"internal/guestabi":    leaf,
	"internal/artifact":    leaf,
	"internal/imagestore":  leaf,
	"internal/netcheck":    leaf,
	"sdk/chunked":          leaf,
	"sdk/sessiontoken":     leaf,
	"internal/exposureabi": leaf,
	"sdk/bearer":           leaf,
	"internal/cafile":      leaf,
	"internal/treemove":    leaf,
	"internal/sparsefile":  leaf,
	"internal/enumlabel":   leaf,
	"sdk/serviceconn":      leaf,
	"internal/fence":       leaf,
	"internal/buildinfo":   leaf,
	"internal/logging":     leaf,
	"internal/tracing":     leaf,
	"internal/errdetail":   leaf,
	"sdk/failure":          leaf,
	"internal/fdlimit":     leaf,
	"internal/callshare":   leaf,
	"internal/admission":   leaf,
	"internal/config":      wiring,
	"sdk":                  client,
	"internal/cli":         client,
	"internal/sdktest":     client,
	"internal/daemon":      wiring,
	"cmd/kibotos":          client, // the CLI: none of the server's packages and their initialisation
	"cmd/kibotos-server":   wiring,
	"bench":                wiring,
	"gen":                  gen,
	"internal/testutil":    test,
}

// allowed lists, for each part, the parts its packages may import.
var allowed = map[string][]string{
	ctrl:   {ctrl, leaf, gen},
	host:   {host, leaf, gen},
	guest:  {guest, gen},
	leaf:   {leaf, gen},
	client: {client, leaf, gen},
	gen:    {gen},
	test:   {test, ctrl, host, leaf, gen},
	wiring: {wiring, ctrl, host, guest, leaf, client, gen, test},
}

// partOf returns the part of a package of this module, or "" for a path
// outside it.
func partOf(pkg string) string {
	rel, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return ""
	}
	best, part := "", "unknown"
	for prefix, p := range parts {
		if (rel == prefix || strings.HasPrefix(rel, prefix+"/")) && len(prefix) > len(best) {
			best, part = prefix, p
		}
	}
	return part
}

// guestLeaves are the only leaves the guest may import: the guest agent is
// static and small, so it links nothing of the host's or ctrl's.
var guestLeaves = []string{module + "/internal/guestabi", module + "/sdk/failure", module + "/internal/treemove"}

// forbidden returns why from may not import to, or "".
func forbidden(from, to string) string {
	pf, pt := partOf(from), partOf(to)
	if pt == "" {
		return ""
	}
	if pf == guest && pt == leaf {
		for _, l := range guestLeaves {
			if to == l {
				return ""
			}
		}
		return "the guest imports no shared leaf but guestabi, sdk/failure and treemove"
	}
	for _, ok := range allowed[pf] {
		if ok == pt {
			return ""
		}
	}
	return pf + " may not import " + pt
}

// TestFences checks every import of every package of the module, read
// from the source here (so the test cache notices a changed import). Tests
// are left out: an end-to-end test of the guest's data plane runs it under
// the host's runtime, and that is no dependency of the product.
func TestFences(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if name := d.Name(); dir != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		pkg, err := build.ImportDir(dir, 0)
		var noGo *build.NoGoError
		if errors.As(err, &noGo) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, dir)
		from := path.Join(module, filepath.ToSlash(rel))
		if partOf(from) == "unknown" {
			t.Errorf("%s belongs to no part: add it to the fence's parts", from)
		}
		for _, to := range pkg.Imports {
			checked++
			if why := forbidden(from, to); why != "" {
				t.Errorf("%s imports %s: %s", from, to, why)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d imports checked from %s", checked, root)
	}
}

// TestForbidden pins the rules on examples, so a change of the tables is
// deliberate.
func TestForbidden(t *testing.T) {
	m := module + "/"
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{m + "internal/ctrl/workspaces", m + "internal/ctrl/store", true},
		{m + "internal/ctrl/workspaces", m + "internal/host/runtime", false},
		{m + "internal/ctrl/api", m + "internal/guest/pid1", false},
		{m + "internal/host/agent", m + "internal/ctrl/store", false},
		{m + "internal/host/agent", m + "internal/imagestore", true},
		{m + "internal/host/agent", m + "internal/guest/dataplane", false},
		{m + "internal/guest/dataplane", m + "internal/host/runtime", false},
		{m + "internal/guest/pid1", m + "internal/guestabi", true},
		{m + "internal/guest/pid1", m + "internal/netcheck", false},
		{m + "cmd/kibotos-guest", m + "internal/guest/pid1", true},
		{m + "internal/imagestore", m + "internal/ctrl/store", false},
		{m + "internal/cli", m + "internal/ctrl/api", false},
		{m + "sdk", m + "gen/kibotos/data/v1", true},
		{m + "internal/host/agent", m + "sdk/sessiontoken", true},
		{m + "internal/ctrl/sessions", m + "sdk", false},
		{m + "sdk/serviceconn", m + "sdk", false},
		{m + "internal/daemon", m + "internal/host/agent", true},
		{m + "internal/ctrl/store", "modernc.org/sqlite", true},
	} {
		why := forbidden(c.from, c.to)
		if (why == "") != c.ok {
			t.Errorf("%s -> %s: allowed %v, want %v (%s)", c.from, c.to, why == "", c.ok, why)
		}
	}
}
