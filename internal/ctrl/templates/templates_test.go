package templates_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/api"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/pagetoken"
	"github.com/kibotos/kibotos/internal/ctrl/registry"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/testutil"
)

// Projects of every test environment.
const (
	operatorProject = "prj_operator"
	projectA        = "prj_a"
	projectB        = "prj_b"
)

const (
	tarballFormat = ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL
	layoutFormat  = ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_OCI_LAYOUT_TAR
)

var revisionPattern = regexp.MustCompile(`^sha256-[0-9a-f]{16}$`)

type env struct {
	t      *testing.T
	st     store.Store
	images *imagestore.Store
	svc    *templates.Service
	url    string
}

// forEachStore runs fn on SQLite and, when configured, PostgreSQL.
func forEachStore(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, newEnv(t, testutil.SQLiteStore(t))) })
	t.Run("postgres", func(t *testing.T) { fn(t, newEnv(t, testutil.PostgresStore(t))) })
}

// forEachStoreWithBuiltin is forEachStore on stores that hold the builtin
// template, made from the host's busybox; it skips without one.
func forEachStoreWithBuiltin(t *testing.T, fn func(t *testing.T, e *env)) {
	if _, err := os.Stat(imagestore.DefaultBusybox); err != nil {
		t.Skipf("no busybox: %v", err)
	}
	forEachStore(t, func(t *testing.T, e *env) {
		if err := templates.EnsureBuiltin(context.Background(), e.st, e.images, imagestore.DefaultBusybox); err != nil {
			t.Fatal(err)
		}
		fn(t, e)
	})
}

// newEnv serves the TemplateService over cleartext HTTP/2 (Connect client
// streaming needs it) on a store with three projects.
func newEnv(t *testing.T, st store.Store) *env {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	err := st.Update(ctx, func(tx store.Tx) error {
		return errors.Join(
			tx.CreateProject(ctx, store.Project{ID: operatorProject, Name: "default", Operator: true, CreatedAt: now}),
			tx.CreateProject(ctx, store.Project{ID: projectA, Name: "a", CreatedAt: now}),
			tx.CreateProject(ctx, store.Project{ID: projectB, Name: "b", CreatedAt: now}),
		)
	})
	if err != nil {
		t.Fatal(err)
	}
	images, err := imagestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	svc := &templates.Service{Store: st, Images: images, Pages: pagetoken.New([]byte("test page key"))}
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewTemplateServiceHandler(api.NewTemplateService(svc), connect.WithInterceptors(testAuth{})))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = h2c()
	srv.Start()
	t.Cleanup(srv.Close)
	return &env{t: t, st: st, images: images, svc: svc, url: srv.URL}
}

func h2c() *http.Protocols {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &p
}

const callerHeader = "X-Test-Caller"

// testAuth puts the caller the test client names into the context: the
// header carries "<project>/<role>"; the operator project's callers are
// operators.
type testAuth struct{}

func (testAuth) caller(ctx context.Context, h http.Header) (context.Context, error) {
	project, role, ok := strings.Cut(h.Get(callerHeader), "/")
	if !ok {
		return nil, connect.NewError(connect.CodeUnauthenticated, auth.ErrUnauthenticated)
	}
	return auth.WithCaller(ctx, auth.Caller{ProjectID: project, Role: auth.Role(role), Operator: project == operatorProject}), nil
}

func (a testAuth) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		ctx, err := a.caller(ctx, req.Header())
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (testAuth) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a testAuth) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		ctx, err := a.caller(ctx, conn.RequestHeader())
		if err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

type headerTransport struct {
	base  http.RoundTripper
	value string
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(callerHeader, h.value)
	return h.base.RoundTrip(r)
}

// client returns a TemplateService client calling as an admin of project.
func (e *env) client(project string) ctrlv1connect.TemplateServiceClient {
	return e.clientAs(project, auth.Admin)
}

func (e *env) clientAs(project string, role auth.Role) ctrlv1connect.TemplateServiceClient {
	tr := &http.Transport{Protocols: h2c()}
	e.t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: headerTransport{base: tr, value: project + "/" + string(role)}}
	return ctrlv1connect.NewTemplateServiceClient(hc, e.url)
}

func cmd(id string) *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: id} }

func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if got := connect.CodeOf(err); err == nil || got != code {
		t.Errorf("%s: got %v (%v), want %v", what, got, err, code)
	}
}

// must(f())(t, what) is f's value, or fails the test with f's error.
func must[T any](v T, err error) func(t *testing.T, what string) T {
	return func(t *testing.T, what string) T {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
}

var commands atomic.Int64

func (e *env) create(c ctrlv1connect.TemplateServiceClient, id string, labels map[string]string) *ctrlv1.Template {
	e.t.Helper()
	resp := must(c.CreateTemplate(context.Background(), connect.NewRequest(&ctrlv1.CreateTemplateRequest{
		Command: cmd(fmt.Sprintf("create-%s-%d", id, commands.Add(1))), TemplateId: id, Labels: labels,
	})))(e.t, "CreateTemplate "+id)
	return resp.Msg.Template
}

func (e *env) get(c ctrlv1connect.TemplateServiceClient, id string) (*ctrlv1.Template, error) {
	resp, err := c.GetTemplate(context.Background(), connect.NewRequest(&ctrlv1.GetTemplateRequest{TemplateId: id}))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Template, nil
}

// send runs one ImportTemplateRevision upload of msgs.
func send(c ctrlv1connect.TemplateServiceClient, msgs ...*ctrlv1.ImportTemplateRevisionRequest) (*ctrlv1.ImportTemplateRevisionResponse, error) {
	stream := c.ImportTemplateRevision(context.Background())
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the server answered early; CloseAndReceive has its answer
		}
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func startMsg(s *ctrlv1.ImportTemplateRevisionStart) *ctrlv1.ImportTemplateRevisionRequest {
	return &ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Start{Start: s}}
}

func chunkMsg(b []byte) *ctrlv1.ImportTemplateRevisionRequest {
	return &ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Chunk{Chunk: b}}
}

// upload imports an archive, sent in 16 KiB chunks.
func upload(c ctrlv1connect.TemplateServiceClient, command, id string, format ctrlv1.ImageArchiveFormat, data []byte, setDefault bool) (*ctrlv1.ImportTemplateRevisionResponse, error) {
	msgs := []*ctrlv1.ImportTemplateRevisionRequest{startMsg(&ctrlv1.ImportTemplateRevisionStart{
		Command: cmd(command), TemplateId: id,
		Source:     &ctrlv1.ImportTemplateRevisionStart_Archive{Archive: format},
		SetDefault: setDefault,
	})}
	for len(data) > 0 {
		n := min(len(data), 16<<10)
		msgs = append(msgs, chunkMsg(data[:n]))
		data = data[n:]
	}
	return send(c, msgs...)
}

// randomImage is a linux/amd64 image of two random layers of 4 KiB each.
func randomImage(t *testing.T) v1.Image {
	t.Helper()
	img := must(random.Image(4096, 2))(t, "random image")
	cf := must(img.ConfigFile())(t, "config").DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "HELLO=world"}
	return must(mutate.ConfigFile(img, cf))(t, "config")
}

// dockerArchive is img as `docker save` writes it.
func dockerArchive(t *testing.T, img v1.Image) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := tarball.Write(name.MustParseReference("kibotos.test/img:latest"), img, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layoutArchive is img as a tar of an OCI image layout.
func layoutArchive(t *testing.T, img v1.Image) []byte {
	t.Helper()
	dir := t.TempDir()
	p := must(layout.Write(dir, empty.Index))(t, "layout")
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// checkRevision checks the fields of an imported revision.
func (e *env) checkRevision(r *ctrlv1.TemplateRevision, source string) {
	e.t.Helper()
	if !revisionPattern.MatchString(r.GetRevision()) {
		e.t.Errorf("revision %q does not match %s", r.GetRevision(), revisionPattern)
	}
	if want := imagestore.Revision(r.GetImageDigest()); r.GetRevision() != want {
		e.t.Errorf("revision %q of image %s, want %q", r.GetRevision(), r.GetImageDigest(), want)
	}
	if !e.images.HasBlob(r.GetImageDigest()) {
		e.t.Errorf("image store lacks the manifest %s", r.GetImageDigest())
	}
	if r.GetSizeBytes() == 0 || r.GetCreatedAt() == nil || r.GetSource() != source {
		e.t.Errorf("revision %v: want size, created_at and source %q", r, source)
	}
}

func TestBuiltin(t *testing.T) {
	forEachStoreWithBuiltin(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		a := e.client(projectA)
		base := must(e.get(a, "base"))(t, "get base")
		if len(base.Revisions) != 1 || base.DefaultRevision != base.Revisions[0].Revision || base.Revision != 2 {
			t.Fatalf("base = %v; want one revision, the default, at revision 2", base)
		}
		e.checkRevision(base.Revisions[0], "builtin")
		if base.Revisions[0].UnpackedBytes < 1<<20 {
			t.Errorf("unpacked_bytes = %d; busybox alone is larger", base.Revisions[0].UnpackedBytes)
		}

		// Idempotent: nothing changes on the next start.
		if err := templates.EnsureBuiltin(ctx, e.st, e.images, imagestore.DefaultBusybox); err != nil {
			t.Fatal(err)
		}
		if again := must(e.get(a, "base"))(t, "get base"); !proto.Equal(again, base) {
			t.Errorf("after a second EnsureBuiltin base = %v, want %v", again, base)
		}

		// Workspace creation resolves it.
		err := e.st.View(ctx, func(tx store.Tx) error {
			o, err := templates.FindTemplate(ctx, tx, projectB, "base")
			if err != nil {
				return err
			}
			revs, err := tx.TemplateRevisions(ctx, o.ProjectID, "base")
			if err != nil || len(revs) != 1 {
				return fmt.Errorf("revisions %v, %v", revs, err)
			}
			_, img, err := templates.DecodeRevision(revs[0])
			if err != nil {
				return err
			}
			if img.Digest != base.Revisions[0].ImageDigest || len(img.Layers) != 1 || img.TemplateID != "base" {
				return fmt.Errorf("stored image %+v", img)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}

		// Every project sees it in lists; none but the operator changes it.
		list := must(a.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{})))(t, "list")
		if len(list.Msg.Templates) != 1 || list.Msg.Templates[0].TemplateId != "base" {
			t.Errorf("project list = %v, want base", list.Msg.Templates)
		}
		_, err = a.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{Command: cmd("c1"), TemplateId: "base"}))
		wantCode(t, "create base", err, connect.CodeAlreadyExists)
		_, err = a.UpdateTemplateLabels(ctx, connect.NewRequest(&ctrlv1.UpdateTemplateLabelsRequest{
			Command: cmd("c2"), TemplateId: "base", ExpectedLabelsRevision: 1, Labels: map[string]string{"a": "b"}}))
		wantCode(t, "label base", err, connect.CodePermissionDenied)
		_, err = a.SetTemplateDefault(ctx, connect.NewRequest(&ctrlv1.SetTemplateDefaultRequest{
			Command: cmd("c3"), TemplateId: "base", ExpectedRevision: base.Revision, DefaultRevision: base.DefaultRevision}))
		wantCode(t, "set default of base", err, connect.CodePermissionDenied)
		_, err = a.DeleteTemplate(ctx, connect.NewRequest(&ctrlv1.DeleteTemplateRequest{Command: cmd("c4"), TemplateId: "base"}))
		wantCode(t, "delete base", err, connect.CodePermissionDenied)
		_, err = upload(a, "c5", "base", tarballFormat, dockerArchive(t, randomImage(t)), false)
		wantCode(t, "import into base", err, connect.CodePermissionDenied)
		_, err = e.clientAs(operatorProject, auth.Editor).UpdateTemplateAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateTemplateAnnotationsRequest{
			Command: cmd("c6"), TemplateId: "base", ExpectedAnnotationsRevision: 1, Annotations: map[string]string{"a": "b"}}))
		wantCode(t, "operator editor annotates base", err, connect.CodePermissionDenied)
		op := e.client(operatorProject)
		labeled := must(op.UpdateTemplateLabels(ctx, connect.NewRequest(&ctrlv1.UpdateTemplateLabelsRequest{
			Command: cmd("c7"), TemplateId: "base", ExpectedLabelsRevision: 1, Labels: map[string]string{"tier": "builtin"}})))(t, "operator labels base")
		if l := labeled.Msg.Template; l.LabelsRevision != 2 || l.Labels["tier"] != "builtin" {
			t.Errorf("labeled base = %v", l)
		}

		// A new busybox (the same binary with a byte more) adds a revision
		// and makes it the default.
		bin := must(os.ReadFile(imagestore.DefaultBusybox))(t, "read busybox")
		changed := filepath.Join(t.TempDir(), "busybox")
		if err := os.WriteFile(changed, append(bin, 0), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := templates.EnsureBuiltin(ctx, e.st, e.images, changed); err != nil {
			t.Fatal(err)
		}
		next := must(e.get(a, "base"))(t, "get base")
		if len(next.Revisions) != 2 || next.Revisions[0].Revision != base.DefaultRevision ||
			next.DefaultRevision != next.Revisions[1].Revision || next.Revision != base.Revision+1 {
			t.Errorf("base after a busybox change = %v", next)
		}
	})
}

func TestImportAndDefault(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		a := e.client(projectA)
		created := e.create(a, "py", map[string]string{"lang": "python"})
		if created.Revision != 1 || created.DefaultRevision != "" || len(created.Revisions) != 0 || created.LabelsRevision != 1 {
			t.Fatalf("created = %v", created)
		}

		// The first revision becomes the default although set_default is off.
		img1 := randomImage(t)
		archive1 := dockerArchive(t, img1)
		first := must(upload(a, "imp-1", "py", tarballFormat, archive1, false))(t, "import 1")
		rev1 := first.Revision
		e.checkRevision(rev1, "archive")
		if rev1.UnpackedBytes != 2*4096 {
			t.Errorf("unpacked_bytes = %d, want %d", rev1.UnpackedBytes, 2*4096)
		}
		layers := must(img1.Layers())(t, "layers")
		var size int64
		for _, l := range layers {
			size += must(l.Size())(t, "size")
		}
		if rev1.SizeBytes != uint64(size) {
			t.Errorf("size_bytes = %d, want %d", rev1.SizeBytes, size)
		}
		if tp := first.Template; tp.DefaultRevision != rev1.Revision || tp.Revision != 2 || len(tp.Revisions) != 1 {
			t.Errorf("template after the first import = %v", tp)
		}

		// The stored revision is what workspace creation reads.
		err := e.st.View(ctx, func(tx store.Tx) error {
			revs, err := tx.TemplateRevisions(ctx, projectA, "py")
			if err != nil || len(revs) != 1 {
				return fmt.Errorf("revisions %v, %v", revs, err)
			}
			r, img, err := templates.DecodeRevision(revs[0])
			if err != nil {
				return err
			}
			if !proto.Equal(r, rev1) || img.Digest != rev1.ImageDigest || len(img.Layers) != 2 || img.Env[1] != "HELLO=world" {
				return fmt.Errorf("stored %v %+v", r, img)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}

		// A retry of the same command replays the response; the same ID
		// with other bytes is refused.
		replay := must(upload(a, "imp-1", "py", tarballFormat, archive1, false))(t, "replay import 1")
		if !proto.Equal(replay, first) {
			t.Errorf("replay = %v, want %v", replay, first)
		}
		_, err = upload(a, "imp-1", "py", tarballFormat, dockerArchive(t, randomImage(t)), false)
		wantCode(t, "same command, other bytes", err, connect.CodeAlreadyExists)

		// The same image again under a new command: the existing revision.
		again := must(upload(a, "imp-1b", "py", tarballFormat, archive1, true))(t, "import 1 again")
		if !proto.Equal(again.Revision, rev1) || again.Template.Revision != 2 || len(again.Template.Revisions) != 1 {
			t.Errorf("re-import = %v", again)
		}

		// A second image as an OCI layout, not the default.
		img2 := randomImage(t)
		second := must(upload(a, "imp-2", "py", layoutFormat, layoutArchive(t, img2), false))(t, "import 2")
		rev2 := second.Revision
		e.checkRevision(rev2, "oci-layout")
		if d := must(img2.Digest())(t, "digest"); rev2.ImageDigest != d.String() {
			t.Errorf("image_digest = %s, want %s", rev2.ImageDigest, d)
		}
		if tp := second.Template; tp.DefaultRevision != rev1.Revision || tp.Revision != 2 ||
			len(tp.Revisions) != 2 || tp.Revisions[0].Revision != rev1.Revision || tp.Revisions[1].Revision != rev2.Revision {
			t.Errorf("template after the second import = %v", tp)
		}

		// SetTemplateDefault: CAS, unknown revision, idempotent equal content.
		set := func(command string, expected uint64, rev string) (*ctrlv1.Template, error) {
			resp, err := a.SetTemplateDefault(ctx, connect.NewRequest(&ctrlv1.SetTemplateDefaultRequest{
				Command: cmd(command), TemplateId: "py", ExpectedRevision: expected, DefaultRevision: rev}))
			if err != nil {
				return nil, err
			}
			return resp.Msg.Template, nil
		}
		_, err = set("set-stale", 1, rev2.Revision)
		wantCode(t, "stale expected_revision", err, connect.CodeAborted)
		_, err = set("set-unknown", 2, "sha256-0000000000000000")
		wantCode(t, "unknown revision", err, connect.CodeNotFound)
		if tp := must(set("set-1", 2, rev2.Revision))(t, "set default"); tp.DefaultRevision != rev2.Revision || tp.Revision != 3 {
			t.Errorf("after SetTemplateDefault = %v", tp)
		}
		if tp := must(set("set-2", 3, rev2.Revision))(t, "set same default"); tp.Revision != 3 {
			t.Errorf("setting the same default moved revision to %d", tp.Revision)
		}
		_, err = set("set-1", 2, rev1.Revision)
		wantCode(t, "command reused for another request", err, connect.CodeAlreadyExists)

		// A third image with set_default moves the default.
		third := must(upload(a, "imp-3", "py", tarballFormat, dockerArchive(t, randomImage(t)), true))(t, "import 3")
		if tp := third.Template; tp.DefaultRevision != third.Revision.Revision || tp.Revision != 4 || len(tp.Revisions) != 3 {
			t.Errorf("after importing with set_default = %v", tp)
		}
		got := must(e.get(a, "py"))(t, "get")
		if !proto.Equal(got, third.Template) {
			t.Errorf("get = %v, want %v", got, third.Template)
		}

		// Labels and annotations: CAS on their own revisions.
		_, err = a.UpdateTemplateLabels(ctx, connect.NewRequest(&ctrlv1.UpdateTemplateLabelsRequest{
			Command: cmd("lab-stale"), TemplateId: "py", ExpectedLabelsRevision: 2, Labels: map[string]string{"x": "y"}}))
		wantCode(t, "stale labels_revision", err, connect.CodeAborted)
		labeled := must(a.UpdateTemplateLabels(ctx, connect.NewRequest(&ctrlv1.UpdateTemplateLabelsRequest{
			Command: cmd("lab-1"), TemplateId: "py", ExpectedLabelsRevision: 1, Labels: map[string]string{"lang": "py3"}})))(t, "labels")
		if tp := labeled.Msg.Template; tp.LabelsRevision != 2 || tp.Labels["lang"] != "py3" || tp.Revision != 4 {
			t.Errorf("labeled = %v", tp)
		}
		annotated := must(a.UpdateTemplateAnnotations(ctx, connect.NewRequest(&ctrlv1.UpdateTemplateAnnotationsRequest{
			Command: cmd("ann-1"), TemplateId: "py", ExpectedAnnotationsRevision: 1, Annotations: map[string]string{"note": "hi there"}})))(t, "annotations")
		if tp := annotated.Msg.Template; tp.AnnotationsRevision != 2 || tp.Annotations["note"] != "hi there" {
			t.Errorf("annotated = %v", tp)
		}

		// Another project sees none of it and may use the same ID.
		b := e.client(projectB)
		_, err = e.get(b, "py")
		wantCode(t, "other project's get", err, connect.CodeNotFound)
		_, err = upload(b, "imp-b", "py", tarballFormat, archive1, false)
		wantCode(t, "other project's import", err, connect.CodeNotFound)
		if own := e.create(b, "py", nil); len(own.Revisions) != 0 {
			t.Errorf("project b's py = %v", own)
		}
	})
}

func TestDelete(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		a := e.client(projectA)
		e.create(a, "web", nil)
		archive := dockerArchive(t, randomImage(t))
		imported := must(upload(a, "imp", "web", tarballFormat, archive, false))(t, "import")

		now := time.Now()
		ws := store.Workspace{ProjectID: projectA, ID: "wsp_1", TemplateID: "web", Body: []byte("{}"), CreatedAt: now, UpdatedAt: now}
		if err := e.st.Update(ctx, func(tx store.Tx) error { return tx.CreateWorkspace(ctx, ws) }); err != nil {
			t.Fatal(err)
		}
		del := func(command string) error {
			_, err := a.DeleteTemplate(ctx, connect.NewRequest(&ctrlv1.DeleteTemplateRequest{Command: cmd(command), TemplateId: "web"}))
			return err
		}
		wantCode(t, "delete while used", del("del-1"), connect.CodeFailedPrecondition)
		if _, err := e.get(a, "web"); err != nil {
			t.Fatalf("refused delete removed the template: %v", err)
		}

		ws.DeletedAt = time.Now()
		if err := e.st.Update(ctx, func(tx store.Tx) error { return tx.UpdateWorkspace(ctx, ws) }); err != nil {
			t.Fatal(err)
		}
		if err := del("del-2"); err != nil {
			t.Fatal(err)
		}
		if err := del("del-2"); err != nil {
			t.Errorf("replayed delete: %v", err)
		}
		wantCode(t, "delete again", del("del-3"), connect.CodeNotFound)
		_, err := e.get(a, "web")
		wantCode(t, "get deleted", err, connect.CodeNotFound)
		_, err = upload(a, "imp-2", "web", tarballFormat, archive, false)
		wantCode(t, "import into deleted", err, connect.CodeNotFound)
		_, err = a.UpdateTemplateLabels(ctx, connect.NewRequest(&ctrlv1.UpdateTemplateLabelsRequest{
			Command: cmd("lab"), TemplateId: "web", ExpectedLabelsRevision: 1}))
		wantCode(t, "label deleted", err, connect.CodeNotFound)
		list := must(a.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{})))(t, "list")
		if len(list.Msg.Templates) != 0 {
			t.Errorf("list after delete = %v", list.Msg.Templates)
		}
		err = e.st.View(ctx, func(tx store.Tx) error {
			_, err := templates.FindTemplate(ctx, tx, projectA, "web")
			return err
		})
		wantCode(t, "workspace reference to deleted", err, connect.CodeNotFound)

		// The ID can be created again, empty; the same image imports anew.
		if again := e.create(a, "web", nil); again.Revision != 1 || len(again.Revisions) != 0 || again.DefaultRevision != "" {
			t.Errorf("re-created = %v", again)
		}
		re := must(upload(a, "imp-3", "web", tarballFormat, archive, false))(t, "re-import")
		if re.Revision.Revision != imported.Revision.Revision || !re.Revision.CreatedAt.AsTime().After(imported.Revision.CreatedAt.AsTime()) ||
			re.Template.DefaultRevision != re.Revision.Revision || len(re.Template.Revisions) != 1 || re.Template.Revision != 2 {
			t.Errorf("re-import into the re-created template = %v", re)
		}
		if got := must(e.get(a, "web"))(t, "get"); !proto.Equal(got, re.Template) {
			t.Errorf("get = %v, want %v", got, re.Template)
		}
		other := must(upload(a, "imp-4", "web", tarballFormat, dockerArchive(t, randomImage(t)), false))(t, "import other")
		if len(other.Template.Revisions) != 2 || other.Template.Revisions[0].Revision != re.Revision.Revision {
			t.Errorf("after another import = %v", other.Template)
		}
	})
}

func TestBadInputs(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		a := e.client(projectA)
		for _, id := range []string{"", "Py", "1py", "-py", "py-", "py_3", "py.3", strings.Repeat("a", 64)} {
			_, err := a.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{Command: cmd("bad"), TemplateId: id}))
			wantCode(t, fmt.Sprintf("template_id %q", id), err, connect.CodeInvalidArgument)
		}
		_, err := a.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{TemplateId: "py"}))
		wantCode(t, "no command", err, connect.CodeInvalidArgument)
		_, err = a.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{
			Command: cmd("bad"), TemplateId: "py", Labels: map[string]string{"bad key!": "v"}}))
		wantCode(t, "bad label", err, connect.CodeInvalidArgument)
		if _, err := a.CreateTemplate(ctx, connect.NewRequest(&ctrlv1.CreateTemplateRequest{
			Command: cmd("ok"), TemplateId: strings.Repeat("a", 63)})); err != nil {
			t.Errorf("63-character ID: %v", err)
		}
		e.create(a, "py", nil)

		start := func(command string, src ctrlv1.ImageArchiveFormat) *ctrlv1.ImportTemplateRevisionRequest {
			return startMsg(&ctrlv1.ImportTemplateRevisionStart{Command: cmd(command), TemplateId: "py",
				Source: &ctrlv1.ImportTemplateRevisionStart_Archive{Archive: src}})
		}
		registry := startMsg(&ctrlv1.ImportTemplateRevisionStart{Command: cmd("bad"), TemplateId: "py",
			Source: &ctrlv1.ImportTemplateRevisionStart_RegistryReference{RegistryReference: "kibotos.test/img:1"}})
		good := dockerArchive(t, randomImage(t))
		for _, c := range []struct {
			name string
			msgs []*ctrlv1.ImportTemplateRevisionRequest
		}{
			{"missing start", nil},
			{"chunk before start", []*ctrlv1.ImportTemplateRevisionRequest{chunkMsg(good), start("bad", tarballFormat)}},
			{"second start", []*ctrlv1.ImportTemplateRevisionRequest{start("bad", tarballFormat), chunkMsg(good), start("bad", tarballFormat)}},
			{"no chunks", []*ctrlv1.ImportTemplateRevisionRequest{start("bad", tarballFormat)}},
			{"empty chunk", []*ctrlv1.ImportTemplateRevisionRequest{start("bad", tarballFormat), chunkMsg(nil)}},
			{"unspecified format", []*ctrlv1.ImportTemplateRevisionRequest{start("bad", 0), chunkMsg(good)}},
			{"no source", []*ctrlv1.ImportTemplateRevisionRequest{startMsg(&ctrlv1.ImportTemplateRevisionStart{Command: cmd("bad"), TemplateId: "py"})}},
			{"no command", []*ctrlv1.ImportTemplateRevisionRequest{start("", tarballFormat), chunkMsg(good)}},
			{"garbage tarball", []*ctrlv1.ImportTemplateRevisionRequest{start("bad", tarballFormat), chunkMsg([]byte("not an image archive"))}},
			{"garbage layout", []*ctrlv1.ImportTemplateRevisionRequest{start("bad", layoutFormat), chunkMsg(bytes.Repeat([]byte{7}, 4096))}},
			{"tarball as layout", []*ctrlv1.ImportTemplateRevisionRequest{start("bad", layoutFormat), chunkMsg(good)}},
			{"truncated tarball", []*ctrlv1.ImportTemplateRevisionRequest{start("bad", tarballFormat), chunkMsg(good[:len(good)/2])}},
			{"chunk after registry reference", []*ctrlv1.ImportTemplateRevisionRequest{registry, chunkMsg(good)}},
			{"bad registry reference", []*ctrlv1.ImportTemplateRevisionRequest{startMsg(&ctrlv1.ImportTemplateRevisionStart{
				Command: cmd("bad"), TemplateId: "py",
				Source: &ctrlv1.ImportTemplateRevisionStart_RegistryReference{RegistryReference: "Not A Reference"}})}},
		} {
			_, err := send(a, c.msgs...)
			wantCode(t, c.name, err, connect.CodeInvalidArgument)
		}
		_, err = send(a, registry)
		wantCode(t, "registry without a Registry", err, connect.CodeUnavailable)

		// Nothing was stored: the template is as created, and command
		// "bad" is still free.
		got := must(e.get(a, "py"))(t, "get")
		if got.Revision != 1 || len(got.Revisions) != 0 {
			t.Errorf("after bad imports py = %v", got)
		}
		if ents, _ := os.ReadDir(filepath.Join(e.images.Dir(), "tmp")); len(ents) != 0 {
			t.Errorf("leftovers in the image store's tmp: %v", ents)
		}
		if _, err := upload(a, "bad", "py", tarballFormat, good, false); err != nil {
			t.Errorf("import under the command ID of failed attempts: %v", err)
		}

		_, err = a.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{PageSize: 1001}))
		wantCode(t, "page_size 1001", err, connect.CodeInvalidArgument)
		_, err = a.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{PageToken: "garbage"}))
		wantCode(t, "bad page token", err, connect.CodeInvalidArgument)
		_, err = a.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{LabelSelector: map[string]string{"bad key!": "x"}}))
		wantCode(t, "bad selector", err, connect.CodeInvalidArgument)
		_, err = a.SetTemplateDefault(ctx, connect.NewRequest(&ctrlv1.SetTemplateDefaultRequest{
			Command: cmd("s"), TemplateId: "py", DefaultRevision: got.DefaultRevision}))
		wantCode(t, "no expected_revision", err, connect.CodeInvalidArgument)
		_, err = e.clientAs(projectA, auth.Viewer).GetTemplate(ctx, connect.NewRequest(&ctrlv1.GetTemplateRequest{}))
		wantCode(t, "get without ID", err, connect.CodeInvalidArgument)
	})
}

func TestArchiveLimit(t *testing.T) {
	e := newEnv(t, testutil.SQLiteStore(t))
	a := e.client(projectA)
	e.create(a, "py", nil)
	archive := dockerArchive(t, randomImage(t))
	e.svc.MaxArchiveBytes = int64(len(archive) - 1)
	_, err := upload(a, "big", "py", tarballFormat, archive, false)
	wantCode(t, "archive over the limit", err, connect.CodeResourceExhausted)
	e.svc.MaxArchiveBytes = int64(len(archive))
	if _, err := upload(a, "big", "py", tarballFormat, archive, false); err != nil {
		t.Errorf("archive at the limit: %v", err)
	}
}

func TestList(t *testing.T) {
	forEachStoreWithBuiltin(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		a := e.client(projectA)
		// Created in an order unlike the IDs' order.
		ids := []string{"zeta", "alpha", "mid", "beta", "omega"}
		for i, id := range ids {
			e.create(a, id, map[string]string{"even": fmt.Sprint(i%2 == 0)})
		}
		e.create(e.client(projectB), "other", nil)

		var got []string
		token := ""
		for pages := 0; ; pages++ {
			resp := must(a.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{PageSize: 2, PageToken: token})))(t, "list")
			if len(resp.Msg.Templates) > 2 || pages > 5 {
				t.Fatalf("page %d has %d templates", pages, len(resp.Msg.Templates))
			}
			for _, tp := range resp.Msg.Templates {
				got = append(got, tp.TemplateId)
			}
			if token = resp.Msg.NextPageToken; token == "" {
				break
			}
		}
		if want := append([]string{"base"}, ids...); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("listed %v, want %v (oldest first)", got, want)
		}

		sel := map[string]string{"even": "true"}
		first := must(a.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{PageSize: 1, LabelSelector: sel})))(t, "list selected")
		if len(first.Msg.Templates) != 1 || first.Msg.Templates[0].TemplateId != "zeta" || first.Msg.NextPageToken == "" {
			t.Fatalf("first selected page = %v", first.Msg)
		}
		_, err := a.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{PageSize: 1, PageToken: first.Msg.NextPageToken}))
		wantCode(t, "token with another selector", err, connect.CodeInvalidArgument)
		_, err = e.client(projectB).ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{
			PageSize: 1, PageToken: first.Msg.NextPageToken, LabelSelector: sel}))
		wantCode(t, "token of another project", err, connect.CodeInvalidArgument)
		rest := must(a.ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{
			PageToken: first.Msg.NextPageToken, LabelSelector: sel})))(t, "list selected")
		var names []string
		for _, tp := range rest.Msg.Templates {
			names = append(names, tp.TemplateId)
		}
		if fmt.Sprint(names) != "[mid omega]" || rest.Msg.NextPageToken != "" {
			t.Errorf("rest of the selection = %v (next %q)", names, rest.Msg.NextPageToken)
		}
	})
}

func TestRegistry(t *testing.T) {
	forEachStore(t, func(t *testing.T, e *env) {
		img := randomImage(t)
		var (
			pulled    []string
			platforms []v1.Platform
			creds     []registry.Credentials
		)
		e.svc.Registry = pullerFunc(func(ctx context.Context, ref string, p v1.Platform, c registry.Credentials) (v1.Image, error) {
			pulled = append(pulled, ref)
			platforms, creds = append(platforms, p), append(creds, c)
			switch ref {
			case "kibotos.test/img:1":
				return img, nil
			case "kibotos.test/missing:1":
				return nil, fmt.Errorf("manifest unknown: %w", registry.ErrNotFound)
			}
			return nil, errors.New("dial tcp: connection refused")
		})
		a := e.client(projectA)
		e.create(a, "py", nil)
		pull := func(command, ref string) (*ctrlv1.ImportTemplateRevisionResponse, error) {
			return send(a, startMsg(&ctrlv1.ImportTemplateRevisionStart{Command: cmd(command), TemplateId: "py",
				Source: &ctrlv1.ImportTemplateRevisionStart_RegistryReference{RegistryReference: ref}}))
		}
		resp := must(pull("p1", "kibotos.test/img:1"))(t, "pull")
		e.checkRevision(resp.Revision, "registry:kibotos.test/img:1")
		if d := must(img.Digest())(t, "digest"); resp.Revision.ImageDigest != d.String() || resp.Template.DefaultRevision != resp.Revision.Revision {
			t.Errorf("pulled %v, want image %s as the default", resp, d)
		}
		if replay := must(pull("p1", "kibotos.test/img:1"))(t, "replay pull"); !proto.Equal(replay, resp) || len(pulled) != 1 {
			t.Errorf("replay = %v after %d pulls", replay, len(pulled))
		}
		_, err := pull("p2", "kibotos.test/missing:1")
		wantCode(t, "missing image", err, connect.CodeNotFound)
		_, err = pull("p3", "unreachable.test/img:1")
		wantCode(t, "unreachable registry", err, connect.CodeUnavailable)
		if !platforms[0].Equals(registry.DefaultPlatform) || creds[0] != (registry.Credentials{}) {
			t.Errorf("pulled for %v with %v, want the default platform, anonymously", platforms[0], creds[0])
		}

		// Credentials and the platform reach the puller; a retry with other
		// credentials replays.
		withCreds := func(password string) (*ctrlv1.ImportTemplateRevisionResponse, error) {
			return send(a, startMsg(&ctrlv1.ImportTemplateRevisionStart{Command: cmd("p4"), TemplateId: "py", Platform: "linux/amd64",
				Source:              &ctrlv1.ImportTemplateRevisionStart_RegistryReference{RegistryReference: "kibotos.test/img:1"},
				RegistryCredentials: &ctrlv1.RegistryCredentials{Username: "u", Password: password}}))
		}
		first := must(withCreds("one"))(t, "pull with credentials")
		n := len(pulled)
		if c := creds[n-1]; c != (registry.Credentials{Username: "u", Password: "one"}) {
			t.Errorf("credentials %v", c)
		}
		if again := must(withCreds("two"))(t, "retry with other credentials"); !proto.Equal(again, first) || len(pulled) != n {
			t.Errorf("retry with other credentials pulled again (%d pulls) or answered %v", len(pulled), again)
		}

		// Registry fields with an archive, and a bad platform, store nothing.
		for what, start := range map[string]*ctrlv1.ImportTemplateRevisionStart{
			"credentials with an archive": {Command: cmd("p5"), TemplateId: "py",
				Source:              &ctrlv1.ImportTemplateRevisionStart_Archive{Archive: tarballFormat},
				RegistryCredentials: &ctrlv1.RegistryCredentials{Username: "u"}},
			"platform with an archive": {Command: cmd("p6"), TemplateId: "py", Platform: "linux/amd64",
				Source: &ctrlv1.ImportTemplateRevisionStart_Archive{Archive: tarballFormat}},
			"bad platform": {Command: cmd("p7"), TemplateId: "py", Platform: "amd64",
				Source: &ctrlv1.ImportTemplateRevisionStart_RegistryReference{RegistryReference: "kibotos.test/img:1"}},
		} {
			_, err := send(a, startMsg(start))
			wantCode(t, what, err, connect.CodeInvalidArgument)
		}
		if len(pulled) != n {
			t.Errorf("refused imports pulled")
		}
	})
}

type pullerFunc func(ctx context.Context, ref string, p v1.Platform, c registry.Credentials) (v1.Image, error)

func (f pullerFunc) Pull(ctx context.Context, ref string, p v1.Platform, c registry.Credentials) (v1.Image, error) {
	return f(ctx, ref, p, c)
}

// The image store's temporary files never outlive an upload.
func TestUploadLeavesNoFiles(t *testing.T) {
	e := newEnv(t, testutil.SQLiteStore(t))
	a := e.client(projectA)
	e.create(a, "py", nil)
	if _, err := upload(a, "i", "py", tarballFormat, dockerArchive(t, randomImage(t)), false); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(filepath.Join(e.images.Dir(), "tmp"))
	if err != nil || len(ents) != 0 {
		t.Errorf("tmp holds %v (%v)", ents, err)
	}
}
