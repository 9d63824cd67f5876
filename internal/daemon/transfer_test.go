package daemon_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// writeTree writes, in a guest, what a transfer must carry: files in the
// writable layer (a changed and a removed file of the template, an opaque
// directory, owners, modes, set-id bits, symbolic and hard links, a fifo,
// random data, a file whose path is 4,095 bytes, the longest a path may
// be, well past it with the host's mount of the layer) and in the Volume
// (a 1 GiB sparse file, the same kinds, a path of 4,095 bytes).
const writeTree = `set -e
deep() { n=$(printf '%0199d' 0); cd "$1"; for i in $(seq 20); do mkdir $n; cd $n; done; echo deeper > $(printf "%0${2}d" 1); }
echo '# changed' >> /etc/group
rm /usr/bin/wget
rm -rf /etc/ssl && mkdir /etc/ssl && echo only > /etc/ssl/only
mkdir -p /root/t/sub && cd /root/t
dd if=/dev/urandom of=rand bs=1M count=4 2>/dev/null
echo secret > sub/secret && chown 1000:1001 sub/secret && chmod 0640 sub/secret
echo tool > tool && chmod 4755 tool
ln -s ../etc/hostname link && ln -s /nowhere dangling
ln rand rand.hard
mkfifo fifo && chmod 0620 fifo
touch -d '2001-02-03 04:05:06' sub
(deep /root/t 87)
cd /data
dd if=/dev/urandom of=blob bs=1M count=8 2>/dev/null
truncate -s 1G sparse
echo middle | dd of=sparse bs=1 seek=536870912 conv=notrunc 2>/dev/null
echo end | dd of=sparse bs=1 seek=1073741820 conv=notrunc 2>/dev/null
mkdir -p owned && chown 123:456 owned && chmod 0750 owned && ln blob owned/blob.hard
ln -s blob owned/blob.link
(deep /data 89)
sync`

// treeSum prints, for every path of the trees a transfer carries, its
// type and mode, owner, size, link count, modification time, link target
// and content hash, then a line saying whether /usr/bin/wget exists, all
// computed inside the guest.
const treeSum = `for root in /root/t /data /etc/ssl; do
  find "$root" -xdev ! -name lost+found | sort | while read -r p; do
    printf '%s ' "$(stat -c '%n %f %u:%g %s %h %Y' "$p")"
    if [ -L "$p" ]; then readlink "$p"
    elif [ -f "$p" ]; then sha256sum < "$p" | cut -d' ' -f1
    else echo; fi
  done
done
cat /etc/group
[ -e /usr/bin/wget ] && echo wget || echo no-wget`

// transfers is a TransferService client of a deployment, over HTTP/2 as
// the SDK's: over HTTP/1.1 an import the server refuses after its first
// message races the rest of the upload, and the transport that fails to
// write it closes the connection under the answer it was reading.
func (d *deployment) transfers() ctrlv1connect.TransferServiceClient {
	return d.transfersOf(d.adminToken())
}

func (d *deployment) transfersOf(token string) ctrlv1connect.TransferServiceClient {
	return ctrlv1connect.NewTransferServiceClient(sdk.NewHTTPClient(nil), d.url, connect.WithInterceptors(bearer.Token(token)))
}

// viewerToken creates a viewer token in the admin token's project.
func (d *deployment) viewerToken() string {
	admin := adminv1connect.NewAdminServiceClient(http.DefaultClient, d.url, connect.WithInterceptors(bearer.Token(d.adminToken())))
	return mustUnary(d.t, admin.CreateToken, &adminv1.CreateTokenRequest{Role: adminv1.Role_ROLE_VIEWER, Name: "viewer"}).Secret
}

func (d *deployment) templates() ctrlv1connect.TemplateServiceClient {
	return ctrlv1connect.NewTemplateServiceClient(http.DefaultClient, d.url, connect.WithInterceptors(bearer.Token(d.adminToken())))
}

func (d *deployment) volumes() ctrlv1connect.VolumeServiceClient {
	return ctrlv1connect.NewVolumeServiceClient(http.DefaultClient, d.url, connect.WithInterceptors(bearer.Token(d.adminToken())))
}

// awaitTransfer polls a Transfer until it leaves the states of work.
func awaitTransfer(t *testing.T, c ctrlv1connect.TransferServiceClient, id string) *ctrlv1.Transfer {
	t.Helper()
	return eventually(t, 3*time.Minute, "transfer "+id, func() (*ctrlv1.Transfer, error) {
		r, err := unary(context.Background(), c.GetTransfer, &ctrlv1.GetTransferRequest{TransferId: id})
		return r.GetTransfer(), err
	}, func(tr *ctrlv1.Transfer) bool {
		switch tr.State {
		case ctrlv1.TransferState_TRANSFER_STATE_EXPORTING, ctrlv1.TransferState_TRANSFER_STATE_IMPORTING,
			ctrlv1.TransferState_TRANSFER_STATE_RESTORING, ctrlv1.TransferState_TRANSFER_STATE_DELETING:
			return false
		}
		return true
	})
}

// download reads a Transfer's artifact.
func download(t *testing.T, c ctrlv1connect.TransferServiceClient, id string) []byte {
	t.Helper()
	stream, err := c.ReadTransferArtifact(context.Background(), connect.NewRequest(&ctrlv1.ReadTransferArtifactRequest{TransferId: id}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var buf bytes.Buffer
	for stream.Receive() {
		buf.Write(stream.Msg().Data)
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// upload imports an artifact declaring digest.
func upload(t *testing.T, c ctrlv1connect.TransferServiceClient, data []byte, digest string) *ctrlv1.Transfer {
	t.Helper()
	tr, err := uploadAs(c, cmd(), data, digest)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// uploadAs imports an artifact declaring digest as the command command.
func uploadAs(c ctrlv1connect.TransferServiceClient, command *ctrlv1.CommandMetadata, data []byte, digest string) (*ctrlv1.Transfer, error) {
	stream := c.ImportTransfer(context.Background())
	first := &ctrlv1.ImportTransferRequest{Command: command, Digest: digest, Labels: map[string]string{"from": "a"}}
	if err := stream.Send(first); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	for len(data) > 0 {
		n := min(len(data), 1<<20)
		if err := stream.Send(&ctrlv1.ImportTransferRequest{Data: data[:n]}); err != nil {
			if errors.Is(err, io.EOF) {
				break // the server answered: CloseAndReceive has it
			}
			return nil, err
		}
		data = data[n:]
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return resp.Msg.Transfer, nil
}

// artifactOf writes an artifact of manifest m holding the layer dir.
func artifactOf(t *testing.T, m *ctrlv1.TransferManifest, dir string) []byte {
	t.Helper()
	return writeArtifact(t, m, func(w *artifact.Writer) error {
		return w.AddTree(context.Background(), artifact.Layer, dir)
	})
}

// writeArtifact writes an artifact of manifest m whose sections add
// writes.
func writeArtifact(t *testing.T, m *ctrlv1.TransferManifest, add func(*artifact.Writer) error) []byte {
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
	if err := add(w); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// blobFiles lists the files of a deployment's blob store but the one that
// names its deployment.
func blobFiles(t *testing.T, home string) []string {
	t.Helper()
	var out []string
	root := filepath.Join(home, "blobs")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && p != filepath.Join(root, "kibotos-deployment") { // the store's owner
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTransferAcrossDeployments(t *testing.T) {
	a := up(t, t.TempDir())
	defer a.stop()
	b := up(t, t.TempDir())
	defer b.stop()
	ta, tb := a.transfers(), b.transfers()

	spec := &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{CpuMillis: 700, MemoryBytes: 192 * mib, WritableLayerBytes: 96 * mib},
		Volume:    &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, MountPath: "/data"},
		NetworkPolicy: &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET,
			Deny: []string{"203.0.113.0/24"}},
	}
	src := a.await(a.create(spec).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if out, err := a.exec(src, "sh", "-c", writeTree); err != nil {
		t.Fatalf("writing the tree: %v: %s", err, out)
	}
	want, err := a.exec(src, "sh", "-c", treeSum)
	if err != nil {
		t.Fatalf("%v: %s", err, want)
	}
	chain := strings.Repeat(strings.Repeat("0", 199)+"/", 20)
	for _, deepest := range []string{"/root/t/" + chain + fmt.Sprintf("%087d", 1), "/data/" + chain + fmt.Sprintf("%089d", 1)} {
		if len(deepest) != 4095 || !strings.Contains(want, deepest+" ") {
			t.Fatalf("the tree holds no path %.20s... of %d bytes", deepest, len(deepest))
		}
	}

	// A running workspace is refused, naming its state.
	_, err = unary(context.Background(), ta.ExportWorkspace, &ctrlv1.ExportWorkspaceRequest{Command: cmd(), WorkspaceId: src.WorkspaceId})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "AVAILABLE") {
		t.Fatalf("export of a running workspace: %v", err)
	}
	a.stopWorkspace(src.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	a.await(src.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)

	exp := mustUnary(t, ta.ExportWorkspace, &ctrlv1.ExportWorkspaceRequest{Command: cmd(), WorkspaceId: src.WorkspaceId,
		Labels: map[string]string{"app": "t"}}).Transfer
	if exp.State != ctrlv1.TransferState_TRANSFER_STATE_EXPORTING {
		t.Fatalf("export returned %v", exp.State)
	}
	done := awaitTransfer(t, ta, exp.TransferId)
	if done.State != ctrlv1.TransferState_TRANSFER_STATE_COMPLETE {
		t.Fatalf("export ended %v: %v", done.State, done.Failure)
	}
	m := done.Manifest
	art := download(t, ta, exp.TransferId)
	if digestOf(art) != m.Digest || uint64(len(art)) != m.SizeBytes {
		t.Fatalf("downloaded %d bytes %s; manifest says %d bytes %s", len(art), digestOf(art), m.SizeBytes, m.Digest)
	}
	t.Logf("artifact: %d bytes for a layer and a volume holding 12 MiB of random data and a 1 GiB sparse file", len(art))
	// A viewer reads the Transfer but not its artifact, which holds the
	// workspace's files (as it gets no data-plane session).
	viewer := a.transfersOf(a.viewerToken())
	mustUnary(t, viewer.GetTransfer, &ctrlv1.GetTransferRequest{TransferId: exp.TransferId})
	if stream, err := viewer.ReadTransferArtifact(context.Background(), connect.NewRequest(&ctrlv1.ReadTransferArtifactRequest{TransferId: exp.TransferId})); err == nil {
		for stream.Receive() {
			t.Fatal("a viewer read a part of the artifact")
		}
		if connect.CodeOf(stream.Err()) != connect.CodePermissionDenied {
			t.Errorf("a viewer's read of the artifact: %v, want permission_denied", stream.Err())
		}
	} else if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("a viewer's read of the artifact: %v, want permission_denied", err)
	}
	if !proto.Equal(m.Resources, src.Spec.Resources) || m.VolumeCapacityBytes == 0 || m.VolumeMountPath != "/data" ||
		m.SourceGeneration != 1 || m.NetworkPolicy.GetDeny()[0] != "203.0.113.0/24" {
		t.Errorf("manifest = %v", m)
	}

	// A flipped byte, a cut file and a file of another format each fail
	// with a message, leave nothing restorable and nothing stored.
	flipped := bytes.Clone(art)
	flipped[len(flipped)/2] ^= 0x40
	for _, c := range []struct {
		name, says string
		data       []byte
		digest     string
	}{
		{"one byte flipped", "damaged", flipped, digestOf(flipped)},
		{"one byte flipped, the digest of the original", "", flipped, m.Digest},
		{"truncated", "truncated", art[:len(art)*2/3], digestOf(art[:len(art)*2/3])},
		{"another format", "not a Kibotos transfer artifact", []byte("PK\x03\x04 a zip file, say"), digestOf([]byte("PK\x03\x04 a zip file, say"))},
	} {
		bad := upload(t, tb, c.data, c.digest)
		if bad.State != ctrlv1.TransferState_TRANSFER_STATE_FAILED || bad.Failure.GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_IMPORTING_TRANSFER ||
			!strings.Contains(bad.Failure.GetMessage(), c.says) {
			t.Errorf("%s: imported as %v: %v", c.name, bad.State, bad.Failure)
		}
		t.Logf("%s: %s", c.name, bad.Failure.GetMessage())
		_, err := unary(context.Background(), tb.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: bad.TransferId})
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("%s: restore of the failed import: %v", c.name, err)
		}
		if files := blobFiles(t, b.home); len(files) != 0 {
			t.Errorf("%s: blobs left after a failed import: %v", c.name, files)
		}
	}

	// An artifact of a template revision B lacks is refused at restore,
	// saying why.
	foreign := proto.CloneOf(m)
	foreign.TemplateImageDigest = "sha256:" + strings.Repeat("0", 64)
	foreignArt := artifactOf(t, foreign, t.TempDir())
	importCmd := cmd()
	orphan, err := uploadAs(tb, importCmd, foreignArt, digestOf(foreignArt))
	if err != nil {
		t.Fatal(err)
	}
	// The same command again is the first result; with other input, a
	// conflict.
	if again, err := uploadAs(tb, importCmd, foreignArt, digestOf(foreignArt)); err != nil || again.TransferId != orphan.TransferId {
		t.Errorf("the same import command again: %v, %v; want transfer %s", again, err, orphan.TransferId)
	}
	if _, err := uploadAs(tb, importCmd, art, m.Digest); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("the import command with another digest: %v", err)
	}
	_, err = unary(context.Background(), tb.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: orphan.TransferId})
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), foreign.TemplateImageDigest) || testutil.ErrorDetail(err).GetReason() != ctrlv1.FailureReason_FAILURE_REASON_NOT_FOUND {
		t.Errorf("restore without the template: %v", err)
	}
	mustUnary(t, tb.DeleteTransfer, &ctrlv1.DeleteTransferRequest{Command: cmd(), TransferId: orphan.TransferId})

	imp := upload(t, tb, art, m.Digest)
	if imp.State != ctrlv1.TransferState_TRANSFER_STATE_IMPORTED || imp.Manifest.Digest != m.Digest || imp.Labels["from"] != "a" {
		t.Fatalf("import: %v", imp)
	}
	rr := mustUnary(t, tb.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: imp.TransferId,
		Labels: map[string]string{"restored": "yes"}})
	if rr.Transfer.State != ctrlv1.TransferState_TRANSFER_STATE_RESTORING || rr.Workspace.WorkspaceId == src.WorkspaceId {
		t.Fatalf("restore: %v", rr)
	}
	restored := b.await(rr.Workspace.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if fin := awaitTransfer(t, tb, imp.TransferId); fin.State != ctrlv1.TransferState_TRANSFER_STATE_RESTORED ||
		fin.RestoredWorkspaceId != restored.WorkspaceId {
		t.Fatalf("transfer after the restore: %v", fin)
	}
	got, err := b.exec(restored, "sh", "-c", treeSum)
	if err != nil {
		t.Fatalf("%v: %s", err, got)
	}
	if got != want {
		t.Errorf("restored tree differs:\n--- exported\n%s\n--- restored\n%s", want, got)
	}
	if du, err := b.exec(restored, "du", "-k", "/data/sparse"); err != nil || !strings.HasPrefix(du, "8\t") && !strings.HasPrefix(du, "12\t") {
		t.Errorf("restored sparse file uses %q KiB (%v): its holes were filled", du, err)
	}
	if restored.Generation != 1 || !proto.Equal(restored.Spec.Resources, src.Spec.Resources) ||
		restored.Spec.NetworkPolicy.Mode != spec.NetworkPolicy.Mode || restored.Labels["restored"] != "yes" {
		t.Errorf("restored workspace = %v", restored)
	}
	if be := testutil.RetentionTier(restored, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT); be.Continuity != ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_CONTINUED {
		t.Errorf("restored layer continuity = %v", be)
	}
	vol := mustUnary(t, b.volumes().GetVolume, &ctrlv1.GetVolumeRequest{VolumeId: restored.Spec.Volume.VolumeId}).Volume
	if vol.Spec.CapacityBytes != m.VolumeCapacityBytes || vol.BoundWorkspaceId != restored.WorkspaceId {
		t.Errorf("restored volume = %v; want %d bytes", vol, m.VolumeCapacityBytes)
	}

	// Deleting the transfers leaves nothing in either blob store.
	for _, d := range []struct {
		dep *deployment
		c   ctrlv1connect.TransferServiceClient
		id  string
	}{{a, ta, exp.TransferId}, {b, tb, imp.TransferId}} {
		mustUnary(t, d.c.DeleteTransfer, &ctrlv1.DeleteTransferRequest{Command: cmd(), TransferId: d.id})
		if tr := awaitTransfer(t, d.c, d.id); tr.State != ctrlv1.TransferState_TRANSFER_STATE_DELETED {
			t.Errorf("deleted transfer is %v", tr.State)
		}
		if files := blobFiles(t, d.dep.home); len(files) != 0 {
			t.Errorf("blobs left after DeleteTransfer: %v", files)
		}
		if ents, _ := os.ReadDir(filepath.Join(d.dep.home, "blobs", "transfers-staging")); len(ents) != 0 {
			t.Errorf("%d entries left in transfers-staging after DeleteTransfer", len(ents))
		}
	}
}

// TestTransferOfFullGrownImages exports a workspace whose writable layer
// and Volume both grew since they were made and are full to the last
// block, and restores it: the new images, of the same sizes, hold all of
// it. (A filesystem made afresh at the grown size has a larger journal
// and inode table than one that grew to it, so less room.)
func TestTransferOfFullGrownImages(t *testing.T) {
	e := newVolumeEnv(t)
	defer e.stop()
	ctx := context.Background()
	vol, err := e.createVolume(&ctrlv1.VolumeSpec{CapacityBytes: 1 * mib}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.awaitVolume(vol.VolumeId, "AVAILABLE", func(v *ctrlv1.Volume) bool { return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE })
	if _, err := e.resize(vol.VolumeId, 4*mib); err != nil {
		t.Fatal(err)
	}
	e.awaitVolume(vol.VolumeId, "grown", func(v *ctrlv1.Volume) bool {
		return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE && v.Spec.CapacityBytes == 4*mib
	})
	spec := withVolume(bound(vol.VolumeId, "/data"))
	spec.Resources.WritableLayerBytes = 16 * mib
	ws := e.await(e.create(spec).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	e.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	ws = e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	if _, err := unary(ctx, e.client.ResizeWorkspaceWritableLayer, &ctrlv1.ResizeWorkspaceWritableLayerRequest{
		Command: cmd(), WorkspaceId: ws.WorkspaceId, ExpectedResourcesRevision: ws.Spec.ResourcesRevision, WritableLayerBytes: 64 * mib}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.start(ws.WorkspaceId); err != nil {
		t.Fatal(err)
	}
	ws = e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	const fill = `for f in /data/full /root/full; do dd if=/dev/urandom of=$f bs=4k 2>/dev/null || true; done; sync
df -k /data / | tail -n 2; sha256sum /data/full /root/full`
	filled := e.run(ws, fill)
	t.Logf("filled:\n%s", filled)
	want := e.run(ws, "sha256sum /data/full /root/full")
	e.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)

	tc := e.transfers()
	exp := mustUnary(t, tc.ExportWorkspace, &ctrlv1.ExportWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId}).Transfer
	if done := awaitTransfer(t, tc, exp.TransferId); done.State != ctrlv1.TransferState_TRANSFER_STATE_COMPLETE {
		t.Fatalf("export ended %v: %v", done.State, done.Failure)
	}
	rr := mustUnary(t, tc.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: exp.TransferId})
	if fin := awaitTransfer(t, tc, exp.TransferId); fin.State != ctrlv1.TransferState_TRANSFER_STATE_RESTORED {
		t.Fatalf("restore of full grown images ended %v: %v", fin.State, fin.Failure)
	}
	restored := e.await(rr.Workspace.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if got := e.run(restored, "sha256sum /data/full /root/full"); got != want {
		t.Errorf("restored files:\n%s\nexported:\n%s", got, want)
	}
}

// TestExportFailureNamesItsCause: an export the host cannot write (a path
// in the writable layer longer than a path may be) is tried again and
// then FAILED with the host's reason, not taken for an artifact that does
// not verify.
func TestExportFailureNamesItsCause(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	// Two chains of 15 names of 150 bytes, one moved to the end of the
	// other: the deepest path is about 4,550 bytes.
	deep := `chain() { cd "$1" && i=0; while [ $i -lt 15 ]; do n=$(printf "%0150d" $i); mkdir $n && cd $n || exit 1; i=$((i+1)); done; pwd; }
mkdir /root/a /root/b && A=$(chain /root/a) && chain /root/b >/dev/null && touch leaf && mv /root/b "$A/b"`
	done := exportWritten(t, d, deep)
	msg := done.GetFailure().GetMessage()
	if done.State != ctrlv1.TransferState_TRANSFER_STATE_FAILED || !strings.Contains(msg, "file name too long") || strings.Contains(msg, "does not verify") {
		t.Errorf("export ended %v: %q, want FAILED naming the long name", done.State, msg)
	}
}

// exportWritten creates a small workspace, runs script in it, stops it,
// exports it and returns the Transfer once the export ended.
func exportWritten(t *testing.T, d *deployment, script string) *ctrlv1.Transfer {
	t.Helper()
	ws := d.await(d.create(small()).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if out, err := d.exec(ws, "sh", "-c", script); err != nil {
		t.Fatalf("%s: %v: %s", script, err, out)
	}
	d.stopWorkspace(ws.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	tc := d.transfers()
	exp := mustUnary(t, tc.ExportWorkspace, &ctrlv1.ExportWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId}).Transfer
	return awaitTransfer(t, tc, exp.TransferId)
}

// TestExportIntoAFullBlobStore: an export whose artifact the blob store
// has no space for fails at once, RESOURCE_EXHAUSTED, saying so, and
// leaves nothing staged: trying again would fill the store again.
func TestExportIntoAFullBlobStore(t *testing.T) {
	home := t.TempDir()
	blobs := filepath.Join(home, "blobs")
	if err := os.MkdirAll(blobs, 0o700); err != nil {
		t.Fatal(err)
	}
	hosttest.Tmpfs(t, blobs, "4m")
	d := up(t, home)
	defer d.stop()
	done := exportWritten(t, d, "head -c 12582912 /dev/urandom > /root/random")
	if f := done.GetFailure(); done.State != ctrlv1.TransferState_TRANSFER_STATE_FAILED || f.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_RESOURCE_EXHAUSTED ||
		!strings.Contains(f.GetMessage(), "no space left") || strings.Contains(f.GetMessage(), "attempts") {
		t.Errorf("export into a full blob store ended %v: %v, want FAILED at once, RESOURCE_EXHAUSTED, saying so", done.State, f)
	}
	if files := blobFiles(t, home); len(files) != 0 {
		t.Errorf("blobs left after the failed export: %v", files)
	}
}

// TestRestoreWhoseVolumeCannotBeMade: an artifact whose Volume's files do
// not fit the capacity it declares fails its restore; the Volume never
// made is FAILED at CREATING_VOLUME with the reason rather than CREATING
// for ever, the workspace cannot be started into it, and deleting the
// workspace deletes the Volume, which holds nothing.
func TestRestoreWhoseVolumeCannotBeMade(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	tc, vc := d.transfers(), d.volumes()
	spec := small()
	spec.Volume = &ctrlv1.WorkspaceVolumeBinding{Mode: ctrlv1.WorkspaceVolumeMode_WORKSPACE_VOLUME_MODE_NEW, MountPath: "/data"}
	src := d.await(d.create(spec).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	d.stopWorkspace(src.WorkspaceId, ctrlv1.StopMode_STOP_MODE_NORMAL)
	d.await(src.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	exp := mustUnary(t, tc.ExportWorkspace, &ctrlv1.ExportWorkspaceRequest{Command: cmd(), WorkspaceId: src.WorkspaceId}).Transfer
	m := awaitTransfer(t, tc, exp.TransferId).Manifest

	// 24 MiB of files in a Volume of 16 MiB.
	m = proto.CloneOf(m)
	m.VolumeCapacityBytes = 16 * mib
	volume := t.TempDir()
	if err := os.WriteFile(filepath.Join(volume, "big"), bytes.Repeat([]byte{1}, 24*mib), 0o644); err != nil {
		t.Fatal(err)
	}
	art := writeArtifact(t, m, func(w *artifact.Writer) error {
		if err := w.AddTree(context.Background(), artifact.Layer, t.TempDir()); err != nil {
			return err
		}
		return w.AddTree(context.Background(), artifact.Volume, volume)
	})
	imp := upload(t, tc, art, digestOf(art))
	if imp.State != ctrlv1.TransferState_TRANSFER_STATE_IMPORTED {
		t.Fatalf("import: %v", imp)
	}
	rr := mustUnary(t, tc.RestoreWorkspace, &ctrlv1.RestoreWorkspaceRequest{Command: cmd(), TransferId: imp.TransferId})
	if tr := awaitTransfer(t, tc, imp.TransferId); tr.State != ctrlv1.TransferState_TRANSFER_STATE_FAILED {
		t.Fatalf("the restore ended %v, want FAILED", tr.State)
	}
	ws := d.await(rr.Workspace.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED)
	volumeID := ws.GetSpec().GetVolume().GetVolumeId()
	v := eventually(t, 30*time.Second, "the Volume to leave CREATING", func() (*ctrlv1.Volume, error) {
		r, err := unary(context.Background(), vc.GetVolume, &ctrlv1.GetVolumeRequest{VolumeId: volumeID})
		return r.GetVolume(), err
	}, func(v *ctrlv1.Volume) bool { return v.GetState() != ctrlv1.VolumeState_VOLUME_STATE_CREATING })
	if v.State != ctrlv1.VolumeState_VOLUME_STATE_FAILED || v.GetFailure().GetStage() != ctrlv1.FailureStage_FAILURE_STAGE_CREATING_VOLUME ||
		!strings.Contains(v.GetFailure().GetMessage(), "no space left on device") {
		t.Errorf("the Volume the restore could not make: %v", v)
	}
	if _, err := unary(context.Background(), d.client.StartWorkspace, &ctrlv1.StartWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId}); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("starting the failed restore: %v, want failed_precondition", err)
	}
	mustUnary(t, d.client.DeleteWorkspace, &ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})
	d.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
	if r, err := unary(context.Background(), vc.GetVolume, &ctrlv1.GetVolumeRequest{VolumeId: volumeID}); err != nil || r.GetVolume().GetState() != ctrlv1.VolumeState_VOLUME_STATE_DELETED {
		t.Errorf("the Volume after its workspace's delete: %v, %v", r.GetVolume(), err)
	}
}
