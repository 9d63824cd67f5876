package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestTransferWithTemplateCLI moves, with the CLI, a workspace of a
// template only deployment A has to deployment B: `ws export
// --with-template` in A, `transfer import` and `transfer restore` in B,
// which imports the carried template; the restored workspace runs it.
func TestTransferWithTemplateCLI(t *testing.T) {
	hosttest.RequireRoot(t)
	bin := build(t)
	a, b := newDeployment(t, bin), newDeployment(t, bin)
	defer a.up.stop()
	defer b.up.stop()

	const hello = "only in A\n"
	a.cli("template", "create", "hello")
	a.cli("template", "import", "hello", testutil.HelloImageArchive(t, hello))
	var created ctrlv1.CreateWorkspaceResponse
	if err := protojson.Unmarshal([]byte(a.cli("ws", "create", "--template", "hello", "--memory", "128Mi", "--disk", "64Mi",
		"--wait", "-o", "json")), &created); err != nil {
		t.Fatal(err)
	}
	ws := created.Workspace.WorkspaceId
	a.cli("ws", "exec", ws, "--", "sh", "-c", "echo kept > /root/mark && sync")
	a.cli("ws", "stop", ws, "--wait")
	// A file that cannot be written is refused before any export runs.
	bad := exec.Command(bin, "ws", "export", ws, "-o", filepath.Join(t.TempDir(), "missing", "ws.kbt"))
	bad.Env = append(os.Environ(), "KIBOTOS_HOME="+a.home, "KIBOTOS_ADDR="+a.up.addr)
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "cannot write the artifact beside") {
		t.Errorf("export to a missing directory: %v: %s", err, out)
	}
	if got := a.cli("transfer", "list", "-o", "json"); strings.Contains(got, "tr_") {
		t.Errorf("an export ran for a file that cannot be written: %s", got)
	}
	file := filepath.Join(t.TempDir(), "ws.kbt")
	a.cli("ws", "export", ws, "-o", file, "--with-template")
	// The artifact can be fetched again.
	var listed ctrlv1.ListTransfersResponse
	if err := protojson.Unmarshal([]byte(a.cli("transfer", "list", "-o", "json")), &listed); err != nil || len(listed.Transfers) != 1 {
		t.Fatalf("transfers after the export: %v, %v", listed.Transfers, err)
	}
	again := filepath.Join(t.TempDir(), "again.kbt")
	a.cli("transfer", "download", listed.Transfers[0].TransferId, "-o", again)
	if x, y := fileBytes(t, file), fileBytes(t, again); !bytes.Equal(x, y) {
		t.Errorf("transfer download wrote %d bytes, the export %d", len(y), len(x))
	}

	var imp ctrlv1.ImportTransferResponse
	if err := protojson.Unmarshal([]byte(b.cli("transfer", "import", file, "-o", "json")), &imp); err != nil {
		t.Fatal(err)
	}
	if !imp.Transfer.GetManifest().GetCarriesTemplate() {
		t.Fatalf("imported manifest carries no template: %v", imp.Transfer.GetManifest())
	}
	var rr ctrlv1.RestoreWorkspaceResponse
	if err := protojson.Unmarshal([]byte(b.cli("transfer", "restore", imp.Transfer.TransferId, "--wait", "-o", "json")), &rr); err != nil {
		t.Fatal(err)
	}
	restored := rr.Workspace.WorkspaceId
	if got := b.cli("ws", "exec", restored, "--", "cat", "/hello.txt", "/root/mark"); got != hello+"kept\n" {
		t.Errorf("restored workspace reads %q", got)
	}
	if got := b.cli("template", "get", "hello"); !strings.Contains(got, imp.Transfer.GetManifest().GetTemplate().GetRevision()) {
		t.Errorf("template carried into B:\n%s", got)
	}
	for _, d := range []*deployment{a, b} {
		d.cli("ws", "delete", map[*deployment]string{a: ws, b: restored}[d], "--wait")
	}
}

func fileBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
