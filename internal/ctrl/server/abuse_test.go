package server_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
)

// knownDefects are answers that break the rule, each with where it comes
// from; the test fails once one is fixed, so that its entry goes.
var knownDefects = map[string]string{
	// The host API stores whatever host_id a holder of the host token
	// sends (workspaces.Service.RegisterHost checks only that it is not
	// empty), so a 256 KiB ID is stored, reported on and watched.
	"/kibotos.host.v1.HostService/RegisterHost, huge strings":     "workspaces.RegisterHost: no bound on host_id",
	"/kibotos.host.v1.HostService/ReportExecutions, huge strings": "accepted for the host RegisterHost stored",
	"/kibotos.host.v1.HostService/WatchAssignments, huge strings": "streams to the host RegisterHost stored, until the deadline",
}

// abusedPackages are the API packages the control plane serves.
var abusedPackages = []protoreflect.FullName{"kibotos.ctrl.v1", "kibotos.admin.v1", "kibotos.host.v1"}

// TestAbuse sends malformed requests to every method of every service the
// control plane serves, read from the generated descriptors: each answer
// is a canonical Connect error that blames the request (never a 5xx, never
// a hang: each call has a deadline), and the store holds afterwards exactly
// what it held before. Two malformed streams connect-go answers itself,
// before any interceptor or handler (see ctrltest.BadRequest.LibraryCode);
// they are counted apart.
func TestAbuse(t *testing.T) {
	srv := ctrltest.Start(t)
	before := srv.Snapshot(t)
	ctx := context.Background()
	methods, sent, library, refused, seen := 0, 0, 0, map[string]int{}, map[string]bool{}
	for _, pkg := range abusedPackages {
		protoregistry.GlobalFiles.RangeFilesByPackage(pkg, func(fd protoreflect.FileDescriptor) bool {
			for i := 0; i < fd.Services().Len(); i++ {
				sd := fd.Services().Get(i)
				token := srv.AdminToken
				if pkg == "kibotos.host.v1" {
					token = ctrltest.HostToken
				}
				for j := 0; j < sd.Methods().Len(); j++ {
					md := sd.Methods().Get(j)
					procedure := "/" + string(sd.FullName()) + "/" + string(md.Name())
					methods++
					for _, bad := range ctrltest.BadRequests(md) {
						sent++
						code, err := ctrltest.Send(ctx, srv.HTTP, srv.URL, procedure, token, md, bad, 10*time.Second)
						refused[code]++
						if bad.LibraryCode != 0 {
							library++
						}
						known := knownDefects[procedure+", "+bad.Name]
						switch {
						case known != "" && err == nil:
							t.Errorf("%s, %s: now refused as it should be; remove it from knownDefects", procedure, bad.Name)
						case known != "":
							seen[procedure+", "+bad.Name] = true
							t.Logf("known defect: %s, %s: %v (%s)", procedure, bad.Name, err, known)
						case err != nil:
							t.Errorf("%s, %s: %v", procedure, bad.Name, err)
						}
					}
				}
			}
			return true
		})
	}
	if methods < 50 {
		t.Fatalf("only %d methods found in the descriptors", methods)
	}
	t.Logf("%d bad requests to %d methods (%d answered by connect-go itself); answers by code: %v", sent, methods, library, refused)
	after := srv.Snapshot(t)
	if len(after["hosts"]) != 1 {
		t.Errorf("hosts after: %s", clipRows(after["hosts"]))
	}
	for k := range knownDefects {
		if !seen[k] {
			t.Errorf("known defect %q was not sent; remove it from knownDefects", k)
		}
	}
	// The one thing a known defect stores: the host RegisterHost accepted.
	delete(after, "hosts")
	delete(before, "hosts")
	if !reflect.DeepEqual(before, after) {
		for table := range after {
			if !reflect.DeepEqual(before[table], after[table]) {
				t.Errorf("table %s changed:\nbefore %s\nafter  %s", table, clipRows(before[table]), clipRows(after[table]))
			}
		}
	}
}

// clipRows renders rows one a line, each cut to 200 bytes.
func clipRows(rows []string) string {
	out := make([]string, len(rows))
	for i, r := range rows {
		if len(r) > 200 {
			r = r[:200] + "…"
		}
		out[i] = r
	}
	return strings.Join(out, "\n")
}
