package daemon_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestTransferWithTemplate exports, with its Template, a workspace of a
// Template imported in A that B lacks; B imports the artifact and the
// restore imports the carried image as a revision of a new Template of
// the same name, then runs the workspace. A carried blob that is not
// what its digest names fails the import.
func TestTransferWithTemplate(t *testing.T) {
	a := up(t, t.TempDir())
	defer a.stop()
	b := up(t, t.TempDir())
	defer b.stop()
	ta, tb := a.transfers(), b.transfers()

	const hello = "carried with the artifact\n"
	_, imported := a.importTemplate("carried", hello)
	spec := small()
	spec.Template = &ctrlv1.TemplateSelector{TemplateId: "carried"}
	spec.Volume = &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, MountPath: "/data"}
	src := a.await(a.create(spec).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if out, err := a.exec(src, "sh", "-c", "echo layer > /root/mark && echo volume > /data/mark && sync"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	a.stopWorkspace(src.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	a.await(src.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)

	exp := mustUnary(t, ta.ExportWorkspace, &ctrlv1.ExportWorkspaceRequest{Command: cmd(), WorkspaceId: src.WorkspaceId, WithTemplate: true}).Transfer
	done := awaitTransfer(t, ta, exp.TransferId)
	if done.State != ctrlv1.TransferState_TRANSFER_STATE_COMPLETE {
		t.Fatalf("export with the template ended %v: %v", done.State, done.Failure)
	}
	m := done.Manifest
	if !m.CarriesTemplate || m.TemplateImageDigest != imported.Revision.ImageDigest {
		t.Fatalf("manifest = %v; want it to carry %s", m, imported.Revision.ImageDigest)
	}
	art := download(t, ta, exp.TransferId)
	t.Logf("artifact with the template: %d bytes", len(art))

	// The same workspace exported without its template: B, lacking it,
	// refuses to restore it, saying why.
	plain := mustUnary(t, ta.ExportWorkspace, &ctrlv1.ExportWorkspaceRequest{Command: cmd(), WorkspaceId: src.WorkspaceId}).Transfer
	if plain = awaitTransfer(t, ta, plain.TransferId); plain.State != ctrlv1.TransferState_TRANSFER_STATE_COMPLETE || plain.Manifest.CarriesTemplate {
		t.Fatalf("export without the template: %v", plain)
	}
	plainArt := download(t, ta, plain.TransferId)
	plainImp := upload(t, tb, plainArt, plain.Manifest.Digest)
	if plainImp.State != ctrlv1.TransferState_TRANSFER_STATE_IMPORTED {
		t.Fatalf("import without the template: %v: %v", plainImp.State, plainImp.Failure)
	}
	_, err := unary(context.Background(), tb.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: plainImp.TransferId})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || testutil.ErrorDetail(err).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND ||
		!strings.Contains(err.Error(), m.TemplateImageDigest) {
		t.Errorf("restore without the template in B: %v", err)
	}
	t.Logf("artifact without the template: %d bytes", len(plainArt))

	// With the template B imports and restores it.
	imp := upload(t, tb, art, m.Digest)
	if imp.State != ctrlv1.TransferState_TRANSFER_STATE_IMPORTED || !imp.Manifest.CarriesTemplate {
		t.Fatalf("import: %v", imp)
	}
	rr := mustUnary(t, tb.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: imp.TransferId})
	if rr.Workspace.Spec.Template.GetTemplateId() != "carried" || rr.Workspace.Spec.Template.GetRevision() != imported.Revision.Revision {
		t.Errorf("restored workspace runs %v; want carried@%s", rr.Workspace.Spec.Template, imported.Revision.Revision)
	}
	restored := b.await(rr.Workspace.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if fin := awaitTransfer(t, tb, imp.TransferId); fin.State != ctrlv1.TransferState_TRANSFER_STATE_RESTORED {
		t.Fatalf("transfer after the restore: %v", fin)
	}
	out, err := b.exec(restored, "cat", "/hello.txt", "/root/mark", "/data/mark")
	if want := hello + "layer\nvolume\n"; err != nil || out != want {
		t.Errorf("restored workspace reads %q (%v), want %q", out, err, want)
	}
	tmplB := b.templates()
	got := mustUnary(t, tmplB.GetTemplate, &ctrlv1.GetTemplateRequest{TemplateId: "carried"}).Template
	if len(got.Revisions) != 1 || got.Revisions[0].ImageDigest != m.TemplateImageDigest ||
		got.Revisions[0].Source != templates.SourceTransfer+imp.TransferId || got.DefaultRevision != imported.Revision.Revision {
		t.Errorf("template carried into B = %v", got)
	}

	// A second import of the artifact restores with the revision B now
	// has: no second Template, no second revision.
	again := upload(t, tb, art, m.Digest)
	rr2 := mustUnary(t, tb.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: again.TransferId})
	if !proto.Equal(rr2.Workspace.Spec.Template, rr.Workspace.Spec.Template) {
		t.Errorf("second restore runs %v, want %v", rr2.Workspace.Spec.Template, rr.Workspace.Spec.Template)
	}
	list := mustUnary(t, tmplB.ListTemplates, &ctrlv1.ListTemplatesRequest{}).Templates
	if n := slices.IndexFunc(list, func(t *ctrlv1.Template) bool { return strings.HasPrefix(t.TemplateId, "carried") }); n < 0 ||
		len(list[n].Revisions) != 1 || slices.ContainsFunc(list[n+1:], func(t *ctrlv1.Template) bool { return strings.HasPrefix(t.TemplateId, "carried") }) {
		t.Errorf("templates after a second restore: %v", list)
	}

	// The same artifact with one carried blob replaced by other bytes of its size
	// (its trailer summing what it holds) is FAILED at import and leaves
	// nothing stored.
	before := blobFiles(t, b.home)
	forged := forgeTemplateBlob(t, art)
	bad := upload(t, tb, forged, digestOf(forged))
	if bad.State != ctrlv1.TransferState_TRANSFER_STATE_FAILED || bad.Failure.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_IMPORTING_TRANSFER ||
		!strings.Contains(bad.Failure.GetMessage(), "does not hold what its digest names") {
		t.Errorf("artifact with a forged template blob: %v: %v", bad.State, bad.Failure)
	}
	t.Logf("forged template blob: %s", bad.Failure.GetMessage())
	_, err = unary(context.Background(), tb.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: bad.TransferId})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("restore of the failed import: %v", err)
	}
	if after := blobFiles(t, b.home); !slices.Equal(after, before) {
		t.Errorf("blobs after a failed import: %v, before: %v", after, before)
	}
}

// forgeTemplateBlob returns art's manifest and template section with the
// content of its last carried blob replaced, a valid artifact otherwise.
func forgeTemplateBlob(t *testing.T, art []byte) []byte {
	t.Helper()
	blobs := map[string][]byte{}
	m, err := artifact.Walk(context.Background(), bytes.NewReader(art), func(e *artifact.Entry, content io.Reader) error {
		if d, ok := strings.CutPrefix(e.Rel, "blobs/sha256/"); ok && e.Section == artifact.Template {
			b, err := io.ReadAll(content)
			blobs["sha256:"+d] = b
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	order := []string{m.TemplateImageDigest}
	for d := range blobs {
		if d != m.TemplateImageDigest {
			order = append(order, d)
		}
	}
	slices.Sort(order[1:])
	last := order[len(order)-1]
	// Of its size: a blob of another size than the image declares is
	// refused before its digest is checked.
	blobs[last] = bytes.Repeat([]byte("!"), len(blobs[last]))
	return writeArtifact(t, m, func(w *artifact.Writer) error {
		return w.AddTemplate(order, func(d string) (io.ReadCloser, int64, error) {
			return io.NopCloser(bytes.NewReader(blobs[d])), int64(len(blobs[d])), nil
		})
	})
}

// TestTransferFailures makes an export fail for real, on ctrl's side (its
// blob store cannot be written: FAILED after a few attempts) and on the
// host's (the layer image is gone: FAILED at once), and a restore fail on
// the host (the layer it fills is too small for the artifact's files):
// each Transfer is FAILED at its stage with a message, nothing stored.
func TestTransferFailures(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	tc := d.transfers()
	ws := d.await(d.create(small()).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	d.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	export := func() *ctrlv1.Transfer {
		t.Helper()
		tr := mustUnary(t, tc.ExportWorkspace, &ctrlv1.ExportWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId}).Transfer
		return awaitTransfer(t, tc, tr.TransferId)
	}
	failedAt := func(what string, tr *ctrlv1.Transfer, stage ctrlv1.FailureStage, says string) {
		t.Helper()
		if tr.State != ctrlv1.TransferState_TRANSFER_STATE_FAILED || tr.Failure.GetStage() != stage || !strings.Contains(tr.Failure.GetMessage(), says) {
			t.Errorf("%s: transfer %v: %v; want FAILED at %v saying %q", what, tr.State, tr.Failure, stage, says)
		}
		t.Logf("%s: %s", what, tr.Failure.GetMessage())
	}

	// The blob store's staging directory cannot be made: a file is in its
	// place.
	blocker := filepath.Join(d.home, "blobs", "transfers-staging")
	if err := os.MkdirAll(filepath.Dir(blocker), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blocker, []byte("in the way"), 0o644); err != nil {
		t.Fatal(err)
	}
	failedAt("blob store unwritable", export(), ctrlv1.FailureStage_FAILURE_STAGE_EXPORTING_WORKSPACE, "3 attempts failed")
	if err := os.Remove(blocker); err != nil {
		t.Fatal(err)
	}
	if files := blobFiles(t, d.home); len(files) != 0 {
		t.Errorf("blobs left after a failed export: %v", files)
	}
	// Once the fault is gone an export completes; the workspace starts
	// again after the failed ones.
	ok := export()
	if ok.State != ctrlv1.TransferState_TRANSFER_STATE_COMPLETE {
		t.Fatalf("export after the fault: %v: %v", ok.State, ok.Failure)
	}

	// A restore whose layer is too small for the artifact's files fails on
	// the host: the Transfer is FAILED at RESTORING_WORKSPACE.
	big := t.TempDir()
	f, err := os.Create(filepath.Join(big, "zeros"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, 96*mib)); err != nil {
		t.Fatal(err)
	}
	f.Close()
	tooBig := artifactOf(t, ok.Manifest, big)
	imp := upload(t, tc, tooBig, digestOf(tooBig))
	if imp.State != ctrlv1.TransferState_TRANSFER_STATE_IMPORTED {
		t.Fatalf("import: %v", imp)
	}
	rr := mustUnary(t, tc.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: imp.TransferId})
	failedAt("layer too small to restore", awaitTransfer(t, tc, imp.TransferId), ctrlv1.FailureStage_FAILURE_STAGE_RESTORING_WORKSPACE, "failed")
	if w, err := d.get(rr.Workspace.WorkspaceId); err != nil || w.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED {
		t.Errorf("workspace of the failed restore: %v, %v", w, err)
	}

	// The writable layer image is gone from the host: FAILED at once.
	layers, err := filepath.Glob(filepath.Join(d.home, "layers", ws.WorkspaceId+"*.ext4"))
	if err != nil || len(layers) != 1 {
		t.Fatalf("layer images of %s: %v, %v", ws.WorkspaceId, layers, err)
	}
	if err := os.Remove(layers[0]); err != nil {
		t.Fatal(err)
	}
	gone := export()
	failedAt("layer image gone", gone, ctrlv1.FailureStage_FAILURE_STAGE_EXPORTING_WORKSPACE, "not on this host")
	if gone.Failure.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND {
		t.Errorf("reason of a missing layer: %v", gone.Failure.GetReason())
	}
	for _, id := range []string{ok.TransferId, imp.TransferId} {
		mustUnary(t, tc.DeleteTransfer, &ctrlv1.DeleteTransferRequest{Command: cmd(), TransferId: id})
		awaitTransfer(t, tc, id)
	}
	if files := blobFiles(t, d.home); len(files) != 0 {
		t.Errorf("blobs left after the failures and deletions: %v", files)
	}
}
