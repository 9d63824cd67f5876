package server_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// knownDefects are answers that break the rule, each with where it comes
// from; the test fails once one is fixed, so that its entry goes.
var knownDefects = map[string]string{}

// abusedPackages are the API packages the control plane serves.
var abusedPackages = []protoreflect.FullName{"kibotos.ctrl.v1", "kibotos.admin.v1", "kibotos.host.v1"}

// TestAbuse sends malformed requests to every method of every service the
// control plane serves, read from the generated descriptors: each answer
// is a canonical Connect error that blames the request (never a 5xx, never
// a hang: each call has a deadline), and the store holds afterwards exactly
// what it held before. Two malformed streams connect-go answers itself,
// before any interceptor or handler (see ctrltest.BadRequest.LibraryCode);
// they are counted apart.
// abuseDeadline bounds each malformed call: a hang, not a slow answer. An
// oversized body takes seconds to send under the race detector on a loaded
// machine.
const abuseDeadline = time.Minute

func TestAbuse(t *testing.T) {
	srv := ctrltest.Start(t)
	before := srv.Snapshot(t)
	ctx := context.Background()
	var tally ctrltest.Tally
	seen := map[string]bool{}
	for _, pkg := range abusedPackages {
		token := srv.AdminToken
		if pkg == "kibotos.host.v1" {
			token = ctrltest.HostToken
		}
		ctrltest.Abuse(pkg, &tally, func(md protoreflect.MethodDescriptor, procedure string, bad ctrltest.BadRequest) (string, error) {
			return ctrltest.Send(ctx, srv.HTTP, srv.URL, procedure, token, md, bad, abuseDeadline)
		}, func(procedure string, bad ctrltest.BadRequest, err error) {
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
		})
	}
	if tally.Methods < 50 {
		t.Fatalf("only %d methods found in the descriptors", tally.Methods)
	}
	t.Log(tally)
	after := srv.Snapshot(t)
	for k := range knownDefects {
		if !seen[k] {
			t.Errorf("known defect %q was not sent; remove it from knownDefects", k)
		}
	}
	if !reflect.DeepEqual(before, after) {
		for table := range after {
			if !reflect.DeepEqual(before[table], after[table]) {
				t.Errorf("table %s changed:\nbefore %s\nafter  %s", table, clipRows(before[table]), clipRows(after[table]))
			}
		}
	}
}

// TestHostIDs checks the host API's rule on host IDs: RegisterHost stores
// only a DNS-label-like ID, and only a registered host reports, watches
// and reads a transfer's artifact; a refused call stores nothing.
func TestHostIDs(t *testing.T) {
	srv := ctrltest.Start(t)
	client := hostv1connect.NewHostServiceClient(srv.HTTP, srv.URL, connect.WithInterceptors(bearer.Token(ctrltest.HostToken)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := srv.Snapshot(t)
	for _, id := range []string{"", "Host-1", "host_1", "-h", "h-", "h.example", strings.Repeat("h", 64), strings.Repeat("h", 256<<10)} {
		_, err := client.RegisterHost(ctx, connect.NewRequest(&hostv1.RegisterHostRequest{HostId: id}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("RegisterHost %.20q: %v, want invalid_argument", id, err)
		}
	}
	report := func(id string) error {
		_, err := client.ReportExecutions(ctx, connect.NewRequest(&hostv1.ReportExecutionsRequest{HostId: id}))
		return err
	}
	watch := func(id string) error {
		stream, err := client.WatchAssignments(ctx, connect.NewRequest(&hostv1.WatchAssignmentsRequest{HostId: id}))
		if err != nil {
			return err
		}
		defer stream.Close()
		if stream.Receive() {
			return nil
		}
		return stream.Err()
	}
	artifact := func(id string) error {
		stream, err := client.GetTransferArtifact(ctx, connect.NewRequest(&hostv1.GetTransferArtifactRequest{HostId: id, TransferId: "tr_unknown"}))
		if err != nil {
			return err
		}
		defer stream.Close()
		for stream.Receive() {
		}
		return stream.Err()
	}
	for name, call := range map[string]func(string) error{"ReportExecutions": report, "WatchAssignments": watch, "GetTransferArtifact": artifact} {
		if err := call("Bad_ID"); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s of a malformed ID: %v, want invalid_argument", name, err)
		}
		if err := call("unregistered"); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%s of an unregistered host: %v, want not_found", name, err)
		}
	}
	if after := srv.Snapshot(t); !reflect.DeepEqual(before, after) {
		t.Errorf("refused calls changed the store:\nbefore %v\nafter  %v", before["hosts"], after["hosts"])
	}
	id := strings.Repeat("h", 63)
	if _, err := client.RegisterHost(ctx, connect.NewRequest(&hostv1.RegisterHostRequest{HostId: id})); err != nil {
		t.Fatalf("RegisterHost of a 63-character ID: %v", err)
	}
	for name, call := range map[string]func(string) error{"ReportExecutions": report, "WatchAssignments": watch} {
		if err := call(id); err != nil {
			t.Errorf("%s of the registered host: %v", name, err)
		}
	}
	// An artifact goes only to the host that restores from it.
	if err := artifact(id); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("GetTransferArtifact of a transfer the host restores nothing from: %v, want permission_denied", err)
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
