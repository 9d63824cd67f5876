package server_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/ctrl/transfers"
	"github.com/kibotos/kibotos/internal/ctrl/workspaces"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// fleet is a control plane with two hosts, h1 and h2, each registered
// with a host token of its own, as an operator issues them.
type fleet struct {
	t          *testing.T
	srv        *ctrltest.Server
	hosts      map[string]hostv1connect.HostServiceClient
	admins     adminv1connect.AdminServiceClient
	workspaces ctrlv1connect.WorkspaceServiceClient
	transfers  ctrlv1connect.TransferServiceClient
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	srv := ctrltest.Start(t)
	srv.AddBuiltinTemplate(t)
	admin := connect.WithInterceptors(bearer.Token(srv.AdminToken))
	admins := adminv1connect.NewAdminServiceClient(srv.HTTP, srv.URL, admin)
	f := &fleet{t: t, srv: srv, hosts: map[string]hostv1connect.HostServiceClient{}, admins: admins,
		workspaces: ctrlv1connect.NewWorkspaceServiceClient(srv.HTTP, srv.URL, admin),
		transfers:  ctrlv1connect.NewTransferServiceClient(srv.HTTP, srv.URL, admin)}
	for _, id := range []string{"h1", "h2"} {
		tok, err := admins.CreateHostToken(t.Context(), connect.NewRequest(&adminv1.CreateHostTokenRequest{Name: id, HostIds: []string{id}}))
		if err != nil {
			t.Fatal(err)
		}
		f.hosts[id] = hostv1connect.NewHostServiceClient(srv.HTTP, srv.URL, connect.WithInterceptors(bearer.Token(tok.Msg.Secret)))
		if _, err := f.hosts[id].RegisterHost(t.Context(), connect.NewRequest(&hostv1.RegisterHostRequest{HostId: id, Capacity: &hostv1.HostCapacity{
			CpuMillis: 64000, MemoryBytes: 256 << 30, LayerBytes: 4 << 40, DefaultLayerBytes: 1 << 30}})); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// assignments returns a host's current desired set.
func (f *fleet) assignments(hostID string) *hostv1.WatchAssignmentsResponse {
	f.t.Helper()
	stream, err := f.hosts[hostID].WatchAssignments(f.t.Context(), connect.NewRequest(&hostv1.WatchAssignmentsRequest{HostId: hostID}))
	if err != nil {
		f.t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() {
		f.t.Fatalf("assignments of %s: %v", hostID, stream.Err())
	}
	return stream.Msg()
}

// placement returns the host a workspace is assigned to, and the other.
func (f *fleet) placement(workspaceID string) (owner, stranger string) {
	f.t.Helper()
	for _, id := range []string{"h1", "h2"} {
		if slices.ContainsFunc(f.assignments(id).Assignments, func(a *hostv1.Assignment) bool { return a.WorkspaceId == workspaceID }) {
			return id, map[string]string{"h1": "h2", "h2": "h1"}[id]
		}
	}
	f.t.Fatalf("workspace %s is assigned to no host", workspaceID)
	return "", ""
}

// observe reports the state of the workspace's current execution as its
// host.
func (f *fleet) observe(hostID, workspaceID string, state hostv1.ObservedState) {
	f.t.Helper()
	for _, a := range f.assignments(hostID).Assignments {
		if a.WorkspaceId == workspaceID {
			f.report(hostID, &hostv1.ReportExecutionsRequest{Reports: []*hostv1.ExecutionReport{{
				ExecutionId: a.ExecutionId, WorkspaceId: workspaceID, Generation: a.Generation, State: state}}})
			return
		}
	}
	f.t.Fatalf("%s is not assigned workspace %s", hostID, workspaceID)
}

// report sends req as hostID, which must take it.
func (f *fleet) report(hostID string, req *hostv1.ReportExecutionsRequest) {
	f.t.Helper()
	if err := f.tryReport(hostID, req); err != nil {
		f.t.Fatalf("ReportExecutions as %s: %v", hostID, err)
	}
}

func (f *fleet) tryReport(hostID string, req *hostv1.ReportExecutionsRequest) error {
	req.HostId = hostID
	_, err := f.hosts[hostID].ReportExecutions(f.t.Context(), connect.NewRequest(req))
	return err
}

// stoppedWorkspace creates a workspace and has its host run and stop it.
func (f *fleet) stoppedWorkspace() (id, owner, stranger string) {
	f.t.Helper()
	ctx := f.t.Context()
	created, err := f.workspaces.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(),
		Spec: &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: 250, MemoryBytes: 256 << 20, WritableLayerBytes: 256 << 20}}}))
	if err != nil {
		f.t.Fatal(err)
	}
	id = created.Msg.Workspace.WorkspaceId
	owner, stranger = f.placement(id)
	f.observe(owner, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING)
	if _, err := f.workspaces.StopWorkspace(ctx, connect.NewRequest(&ctrlv1.StopWorkspaceRequest{Command: cmd(), WorkspaceId: id})); err != nil {
		f.t.Fatal(err)
	}
	f.observe(owner, id, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
	return id, owner, stranger
}

// export starts the export of a stopped workspace.
func (f *fleet) export(workspaceID string, withTemplate bool) *ctrlv1.Transfer {
	f.t.Helper()
	resp, err := f.transfers.ExportWorkspace(f.t.Context(), connect.NewRequest(&ctrlv1.ExportWorkspaceRequest{Command: cmd(),
		WorkspaceId: workspaceID, WithTemplate: withTemplate}))
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.Msg.Transfer
}

// transfer reads a Transfer.
func (f *fleet) transfer(id string) *ctrlv1.Transfer {
	f.t.Helper()
	resp, err := f.transfers.GetTransfer(f.t.Context(), connect.NewRequest(&ctrlv1.GetTransferRequest{TransferId: id}))
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.Msg.Transfer
}

// artifactOf returns an artifact of manifest m, holding nothing else, and
// its digest.
func artifactOf(t *testing.T, m *ctrlv1.TransferManifest) (data []byte, digest string) {
	t.Helper()
	body, err := artifact.EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := artifact.NewWriter(&buf, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), "sha256:" + hex.EncodeToString(sum[:])
}

// restoring imports an artifact of manifest m, holding nothing else, and
// restores a workspace from it: the Transfer is RESTORING.
func (f *fleet) restoring(m *ctrlv1.TransferManifest) (transfer *ctrlv1.Transfer, workspaceID string) {
	f.t.Helper()
	data, digest := artifactOf(f.t, m)
	stream := f.transfers.ImportTransfer(f.t.Context())
	if err := stream.Send(&ctrlv1.ImportTransferRequest{Command: cmd(), Digest: digest, Data: data}); err != nil {
		f.t.Fatal(err)
	}
	imported, err := stream.CloseAndReceive()
	if err != nil {
		f.t.Fatal(err)
	}
	restored, err := f.transfers.RestoreWorkspace(f.t.Context(), connect.NewRequest(&ctrlv1.RestoreWorkspaceRequest{Command: cmd(),
		TransferId: imported.Msg.Transfer.TransferId}))
	if err != nil {
		f.t.Fatal(err)
	}
	return restored.Msg.Transfer, restored.Msg.Workspace.WorkspaceId
}

// TestTransferReportsOfTheHostsOwnWork: a host's progress and failure
// reports move only the exports assigned to it and the restores its
// workspaces make; those of any other Transfer are ignored, and progress
// past its total refuses the call.
func TestTransferReportsOfTheHostsOwnWork(t *testing.T) {
	f := newFleet(t)
	ws, owner, stranger := f.stoppedWorkspace()
	exp := f.export(ws, false)
	progress := func(id string, done, total uint64) *hostv1.ReportExecutionsRequest {
		return &hostv1.ReportExecutionsRequest{Transfers: []*hostv1.TransferReport{{TransferId: id, BytesDone: done, BytesTotal: total}}}
	}
	wantProgress := func(what, id string, done, total uint64) {
		t.Helper()
		tr := f.transfer(id)
		if p := tr.GetProgress(); p.GetBytesDone() != done || p.GetBytesTotal() != total {
			t.Errorf("%s: transfer %s is %s at %d/%d, want %d/%d", what, id, tr.State, p.GetBytesDone(), p.GetBytesTotal(), done, total)
		}
	}

	f.report(stranger, progress(exp.TransferId, 5, 10))
	wantProgress("another host's progress of the export", exp.TransferId, 0, 0)
	f.report(stranger, &hostv1.ReportExecutionsRequest{Transfers: []*hostv1.TransferReport{{TransferId: exp.TransferId,
		FailureMessage: "gone", Permanent: true}}})
	if got := f.transfer(exp.TransferId); got.State != ctrlv1.TransferState_TRANSFER_STATE_EXPORTING {
		t.Errorf("another host's failure of the export: transfer is %s, want EXPORTING", got.State)
	}
	for _, host := range []string{stranger, owner} {
		before := f.transfer(exp.TransferId)
		err := f.tryReport(host, progress(exp.TransferId, 5e9, 1))
		wantCode(t, "progress past its total from "+host, err, connect.CodeInvalidArgument)
		if after := f.transfer(exp.TransferId); !proto.Equal(before, after) {
			t.Errorf("a refused report changed the transfer:\nbefore %v\nafter  %v", before, after)
		}
	}
	f.report(owner, progress(exp.TransferId, 5, 10))
	wantProgress("its host's progress of the export", exp.TransferId, 5, 10)

	// A restore's progress is its workspace's host's to report.
	manifest := proto.CloneOf(exp.Manifest)
	manifest.Digest, manifest.SizeBytes = "", 0
	res, restored := f.restoring(manifest)
	if res.State != ctrlv1.TransferState_TRANSFER_STATE_RESTORING {
		t.Fatalf("restored: transfer is %s", res.State)
	}
	size := res.GetProgress().GetBytesTotal()
	owner, stranger = f.placement(restored)
	f.report(stranger, progress(res.TransferId, 7, size))
	wantProgress("another host's progress of the restore", res.TransferId, 0, size)
	f.report(owner, progress(res.TransferId, 7, size))
	wantProgress("its host's progress of the restore", res.TransferId, 7, size)
}

// TestReportBounds: a ReportExecutions call holds at most a bounded
// number of reports of each kind, and one over a bound is refused with
// nothing stored; a call at the bounds is taken, changes only the host's
// own work, and stores nothing for reports that change nothing.
func TestReportBounds(t *testing.T) {
	f := newFleet(t)
	ws, owner, stranger := f.stoppedWorkspace()
	exp := f.export(ws, false)
	f.report(owner, &hostv1.ReportExecutionsRequest{Transfers: []*hostv1.TransferReport{{TransferId: exp.TransferId, BytesDone: 5, BytesTotal: 10}}})
	var execution *hostv1.Assignment
	for _, a := range f.assignments(owner).Assignments {
		if a.WorkspaceId == ws {
			execution = a
		}
	}
	batch := func(executions, volumes, transfers int) *hostv1.ReportExecutionsRequest {
		req := new(hostv1.ReportExecutionsRequest)
		for range executions {
			req.Reports = append(req.Reports, &hostv1.ExecutionReport{ExecutionId: execution.ExecutionId, WorkspaceId: ws,
				Generation: execution.Generation, State: hostv1.ObservedState_OBSERVED_STATE_RUNNING})
		}
		for range volumes {
			req.Volumes = append(req.Volumes, &hostv1.VolumeReport{VolumeId: "vol_unknown", Condition: ctrlv1.VolumeCondition_VOLUME_CONDITION_HEALTHY})
		}
		for range transfers {
			req.Transfers = append(req.Transfers, &hostv1.TransferReport{TransferId: exp.TransferId, BytesDone: 7, BytesTotal: 10})
		}
		return req
	}

	before := f.srv.Snapshot(t)
	for name, req := range map[string]*hostv1.ReportExecutionsRequest{
		"reports":   batch(workspaces.MaxExecutionReports+1, 0, 0),
		"volumes":   batch(0, workspaces.MaxVolumeReports+1, 0),
		"transfers": batch(0, 0, transfers.MaxReports+1),
	} {
		wantCode(t, name+" over the bound", f.tryReport(owner, req), connect.CodeInvalidArgument)
	}
	if after := f.srv.Snapshot(t); !reflect.DeepEqual(before, after) {
		t.Errorf("refused calls changed the store")
	}

	// Another host's reports of the same work, at the bounds, move none of it.
	start := time.Now()
	f.report(stranger, batch(workspaces.MaxExecutionReports, workspaces.MaxVolumeReports, transfers.MaxReports))
	t.Logf("a call at the bounds from another host took %v", time.Since(start))
	got, err := f.workspaces.GetWorkspace(t.Context(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: ws}))
	if err != nil || got.Msg.Workspace.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Errorf("another host's reports of the workspace: %v, %v; want it STOPPED", got, err)
	}
	if p := f.transfer(exp.TransferId).Progress; p.BytesDone != 5 {
		t.Errorf("another host's reports of the export: progress %v, want 5/10", p)
	}

	// Its own host's progress is stored once, not once a report.
	start = time.Now()
	f.report(owner, batch(0, 0, transfers.MaxReports))
	t.Logf("a call at the bound from the export's host took %v", time.Since(start))
	moved := f.transfer(exp.TransferId)
	if p := moved.Progress; p.BytesDone != 7 || p.BytesTotal != 10 {
		t.Fatalf("its host's progress of the export: %v, want 7/10", p)
	}
	f.report(owner, batch(0, 0, transfers.MaxReports))
	if again := f.transfer(exp.TransferId); !again.UpdatedAt.AsTime().Equal(moved.UpdatedAt.AsTime()) {
		t.Errorf("the same progress again stored the transfer again: updated_at %v, then %v", moved.UpdatedAt.AsTime(), again.UpdatedAt.AsTime())
	}
}

// fetchBlob reads a template blob as hostID and checks it against its
// digest.
func (f *fleet) fetchBlob(hostID, digest string) error {
	stream, err := f.hosts[hostID].GetTemplateBlob(f.t.Context(), connect.NewRequest(&hostv1.GetTemplateBlobRequest{HostId: hostID, Digest: digest}))
	if err != nil {
		return err
	}
	defer stream.Close()
	h := sha256.New()
	for stream.Receive() {
		h.Write(stream.Msg().Data)
	}
	if err := stream.Err(); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != digest {
		f.t.Fatalf("blob %s arrived as %s", digest, got)
	}
	return nil
}

// importHello imports the hello image as a template of the project token
// acts in.
func (f *fleet) importHello(token string) {
	f.t.Helper()
	ctx := f.t.Context()
	tpl := ctrlv1connect.NewTemplateServiceClient(f.srv.HTTP, f.srv.URL, connect.WithInterceptors(bearer.Token(token)))
	if _, err := tpl.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{Command: cmd(), TemplateId: "hello"})); err != nil {
		f.t.Fatal(err)
	}
	archive, err := os.ReadFile(testutil.HelloImageArchive(f.t, "private\n"))
	if err != nil {
		f.t.Fatal(err)
	}
	stream := tpl.ImportTemplateRevision(ctx)
	stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Start{Start: &ctrlv1.ImportTemplateRevisionStart{
		Command: cmd(), TemplateId: "hello", Source: &ctrlv1.ImportTemplateRevisionStart_Archive{
			Archive: ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL}}}})
	stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Chunk{Chunk: archive}})
	if _, err := stream.CloseAndReceive(); err != nil {
		f.t.Fatal(err)
	}
}

// TestTemplateBlobsOfTheHostsWork: a host reads only the template blobs
// its work names (the layers of its executions' templates, the blobs its
// exports carry), as itself; any other digest is not_found, stored or not.
func TestTemplateBlobsOfTheHostsWork(t *testing.T) {
	f := newFleet(t)
	ctx := t.Context()
	ws, owner, stranger := f.stoppedWorkspace()
	var layers []string
	for _, a := range f.assignments(owner).Assignments {
		if a.WorkspaceId == ws {
			for _, l := range a.Template.Layers {
				layers = append(layers, l.Digest)
			}
		}
	}
	if len(layers) == 0 {
		t.Fatal("the workspace's template has no layers")
	}
	for _, d := range layers {
		if err := f.fetchBlob(owner, d); err != nil {
			t.Errorf("a layer of its execution's template, by its host: %v", err)
		}
		wantCode(t, "a layer of another host's execution", f.fetchBlob(stranger, d), connect.CodeNotFound)
	}
	stream, err := f.hosts[stranger].GetTemplateBlob(ctx, connect.NewRequest(&hostv1.GetTemplateBlobRequest{HostId: owner, Digest: layers[0]}))
	if err == nil {
		if stream.Receive() {
			t.Errorf("another token read the blob as %s", owner)
		}
		err = stream.Err()
		stream.Close()
	}
	wantCode(t, "a blob as another token's host", err, connect.CodePermissionDenied)
	for _, id := range []string{"", "Bad_ID"} {
		stream, err := f.hosts[owner].GetTemplateBlob(ctx, connect.NewRequest(&hostv1.GetTemplateBlobRequest{HostId: id, Digest: layers[0]}))
		if err == nil {
			for stream.Receive() {
			}
			err = stream.Err()
			stream.Close()
		}
		wantCode(t, "a blob as host "+id, err, connect.CodeInvalidArgument)
	}

	// An export with its template hands its host every blob of the image.
	exp := f.export(ws, true)
	var carried []string
	for _, a := range f.assignments(owner).Transfers {
		if a.TransferId == exp.TransferId {
			carried = a.TemplateBlobs
		}
	}
	if len(carried) <= len(layers) {
		t.Fatalf("the export carries %v", carried)
	}
	for _, d := range carried {
		if err := f.fetchBlob(owner, d); err != nil {
			t.Errorf("a blob its export carries, by its host: %v", err)
		}
		wantCode(t, "a blob another host's export carries", f.fetchBlob(stranger, d), connect.CodeNotFound)
	}

	// Another tenant's private template: its layers go to the host of its
	// workspace while the workspace is there, and to no host after.
	project, err := f.admins.CreateProject(ctx, connect.NewRequest(&adminv1.CreateProjectRequest{Name: "tenant-b"}))
	if err != nil {
		t.Fatal(err)
	}
	token, err := f.admins.CreateToken(ctx, connect.NewRequest(&adminv1.CreateTokenRequest{ProjectId: project.Msg.Project.ProjectId,
		Role: adminv1.Role_ROLE_ADMIN, Name: "tenant"}))
	if err != nil {
		t.Fatal(err)
	}
	tenant := token.Msg.Secret
	f.importHello(tenant)
	tenantWorkspaces := ctrlv1connect.NewWorkspaceServiceClient(f.srv.HTTP, f.srv.URL, connect.WithInterceptors(bearer.Token(tenant)))
	created, err := tenantWorkspaces.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: cmd(),
		Spec: &ctrlv1.WorkspaceCreateSpec{Template: &ctrlv1.TemplateSelector{TemplateId: "hello"},
			Resources: &ctrlv1.ResourceRequest{CpuMillis: 250, MemoryBytes: 256 << 20, WritableLayerBytes: 256 << 20}}}))
	if err != nil {
		t.Fatal(err)
	}
	private := created.Msg.Workspace.WorkspaceId
	host, other := f.placement(private)
	var privateBlobs []string
	for _, a := range f.assignments(host).Assignments {
		if a.WorkspaceId == private {
			privateBlobs = append(privateBlobs, a.Template.ImageDigest)
			for _, l := range a.Template.Layers {
				if !slices.Contains(layers, l.Digest) {
					privateBlobs = append(privateBlobs, l.Digest)
				}
			}
		}
	}
	if len(privateBlobs) != 2 {
		t.Fatalf("the private template's own blobs: %v", privateBlobs)
	}
	layer := privateBlobs[1]
	if err := f.fetchBlob(host, layer); err != nil {
		t.Errorf("the private layer, by the host of its workspace: %v", err)
	}
	wantCode(t, "the private layer, by another host", f.fetchBlob(other, layer), connect.CodeNotFound)
	if _, err := tenantWorkspaces.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: private})); err != nil {
		t.Fatal(err)
	}
	f.observe(host, private, hostv1.ObservedState_OBSERVED_STATE_DELETED)
	missing := "sha256:" + strings.Repeat("0", 64)
	for _, d := range append(privateBlobs, missing) {
		for _, h := range []string{"h1", "h2"} {
			wantCode(t, "a blob no work of "+h+" names", f.fetchBlob(h, d), connect.CodeNotFound)
		}
	}
}

// TestImportSentTwiceAtOnceRunsOnce: a second call of an ImportTransfer
// command that answers while the first still uploads gets the first
// answer, and leaves no Transfer of its own.
func TestImportSentTwiceAtOnceRunsOnce(t *testing.T) {
	f := newFleet(t)
	data, digest := artifactOf(t, &ctrlv1.TransferManifest{})
	command, half := cmd(), len(data)/2
	live := func() []*ctrlv1.Transfer {
		t.Helper()
		resp, err := f.transfers.ListTransfers(t.Context(), connect.NewRequest(&ctrlv1.ListTransfersRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg.Transfers
	}

	slow := f.transfers.ImportTransfer(t.Context())
	if err := slow.Send(&ctrlv1.ImportTransferRequest{Command: command, Digest: digest, Data: data[:half]}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(live()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first call's Transfer did not appear")
		}
	}
	fast := f.transfers.ImportTransfer(t.Context())
	if err := fast.Send(&ctrlv1.ImportTransferRequest{Command: command, Digest: digest, Data: data}); err != nil {
		t.Fatal(err)
	}
	first, err := fast.CloseAndReceive()
	if err != nil {
		t.Fatal(err)
	}
	if err := slow.Send(&ctrlv1.ImportTransferRequest{Data: data[half:]}); err != nil {
		t.Fatal(err)
	}
	second, err := slow.CloseAndReceive()
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first.Msg, second.Msg) {
		t.Errorf("the call that finished second answered %v, want the first answer %v", second.Msg, first.Msg)
	}
	if got := live(); len(got) != 1 || got[0].TransferId != first.Msg.Transfer.TransferId {
		t.Errorf("Transfers after one command sent twice: %v, want only %s", got, first.Msg.Transfer.TransferId)
	}

	// The same command_id for another request: the call that finishes
	// second is already_exists, and leaves no Transfer either.
	reused := cmd()
	slow = f.transfers.ImportTransfer(t.Context())
	if err := slow.Send(&ctrlv1.ImportTransferRequest{Command: reused, Digest: digest, Labels: map[string]string{"who": "a"},
		Data: data[:half]}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); len(live()) == 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slow call's Transfer did not appear")
		}
	}
	fast = f.transfers.ImportTransfer(t.Context())
	if err := fast.Send(&ctrlv1.ImportTransferRequest{Command: reused, Digest: digest, Labels: map[string]string{"who": "b"},
		Data: data}); err != nil {
		t.Fatal(err)
	}
	winner, err := fast.CloseAndReceive()
	if err != nil {
		t.Fatal(err)
	}
	if err := slow.Send(&ctrlv1.ImportTransferRequest{Data: data[half:]}); err != nil {
		t.Fatal(err)
	}
	if _, err := slow.CloseAndReceive(); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("the same command_id for another request, finished second: %v, want already_exists", err)
	}
	if got := live(); len(got) != 2 || !slices.ContainsFunc(got, func(tr *ctrlv1.Transfer) bool { return tr.TransferId == winner.Msg.Transfer.TransferId }) {
		t.Errorf("Transfers after a command_id reused for another request: %v, want the two answered", got)
	}
}
