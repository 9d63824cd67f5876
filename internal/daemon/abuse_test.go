package daemon_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
)

// storedTables are the tables a data-plane call must never change; the
// others (hosts, workspaces) move with the host agent's reports.
var storedTables = []string{"projects", "tokens", "commands", "objects", "object_labels", "policy_references", "sessions", "template_revisions", "volumes"}

// TestDataPlaneAbuse sends malformed requests, with a valid session token
// of a running workspace unless the request is about the token, to every
// method of kibotos.data.v1 (read from the generated descriptors) through
// the gateway of a real deployment: each answer is a canonical Connect
// error that blames the request, within a deadline, and the control
// plane's store holds afterwards what it held before. The workspace still
// serves a valid call afterwards. Two malformed streams connect-go
// answers itself (see ctrltest.BadRequest.LibraryCode); they are counted
// apart.
func TestDataPlaneAbuse(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	ws := d.sdkWorkspace(128<<20, 64<<20)
	token, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	session, err := ctrlv1connectSessions(d, strings.TrimSpace(string(token))).IssueSession(ctx, connect.NewRequest(&ctrlv1.IssueSessionRequest{WorkspaceId: ws.ID()}))
	if err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(d.home, "kibotos.db")
	before := stored(ctrltest.SnapshotSQLite(t, db))

	var tally ctrltest.Tally
	ctrltest.Abuse("kibotos.data.v1", &tally, func(md protoreflect.MethodDescriptor, procedure string, bad ctrltest.BadRequest) (string, error) {
		return ctrltest.Send(ctx, httpClient(), session.Msg.GetEndpoint(), procedure, session.Msg.GetToken(), md, bad, 10*time.Second)
	}, func(procedure string, bad ctrltest.BadRequest, err error) {
		if err != nil {
			t.Errorf("%s, %s: %v", procedure, bad.Name, err)
		}
	})
	if tally.Methods < 10 {
		t.Fatalf("only %d data-plane methods found in the descriptors", tally.Methods)
	}
	t.Log("data plane:", tally)

	after := stored(ctrltest.SnapshotSQLite(t, db))
	if !reflect.DeepEqual(before, after) {
		for table := range after {
			if !reflect.DeepEqual(before[table], after[table]) {
				t.Errorf("table %s changed:\nbefore %s\nafter  %s", table, strings.Join(before[table], "\n"), strings.Join(after[table], "\n"))
			}
		}
	}
	if _, err := ws.Stat(ctx, "/"); err != nil {
		t.Errorf("the workspace after the abuse: %v", err)
	}
}

// stored keeps the tables of storedTables of a snapshot.
func stored(snap map[string][]string) map[string][]string {
	out := map[string][]string{}
	for _, table := range storedTables {
		out[table] = snap[table]
	}
	return out
}
