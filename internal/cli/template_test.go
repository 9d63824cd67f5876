package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

func (f *ctrlFake) ImportTemplateRevision(_ context.Context, s *connect.ClientStream[ctrlv1.ImportTemplateRevisionRequest]) (*connect.Response[ctrlv1.ImportTemplateRevisionResponse], error) {
	var (
		start *ctrlv1.ImportTemplateRevisionStart
		data  []byte
		n     int
	)
	for s.Receive() {
		switch p := s.Msg().GetPart().(type) {
		case *ctrlv1.ImportTemplateRevisionRequest_Start:
			if start != nil || n > 0 {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("start is not first"))
			}
			start = p.Start
		case *ctrlv1.ImportTemplateRevisionRequest_Chunk:
			data = append(data, p.Chunk...)
			n++
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.calls = append(f.calls, "ImportTemplateRevision")
	f.reqs = append(f.reqs, start)
	f.imported, f.chunks = data, n
	f.mu.Unlock()
	rev := &ctrlv1.TemplateRevision{Revision: "sha256-0123456789abcdef", SizeBytes: uint64(len(data)), Source: "archive"}
	t := &ctrlv1.Template{TemplateId: start.GetTemplateId(), DefaultRevision: rev.Revision, Revisions: []*ctrlv1.TemplateRevision{rev}, Revision: 2}
	return connect.NewResponse(&ctrlv1.ImportTemplateRevisionResponse{Template: t, Revision: rev}), nil
}

// writeTar writes a tar of the named files, in order, and returns its path.
func writeTar(t *testing.T, files ...tarFile) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type tarFile struct {
	name string
	data []byte
}

func TestTemplateImportStreamsArchive(t *testing.T) {
	layer := make([]byte, 2*chunkSize+12345) // three chunks, the last one short
	rand.Read(layer)
	for _, tc := range []struct {
		name  string
		files []tarFile
		want  ctrlv1.ImageArchiveFormat
	}{
		{"docker archive", []tarFile{
			{"abc/layer.tar", layer},
			{"manifest.json", []byte(`[{"Config":"c.json","Layers":["abc/layer.tar"]}]`)},
		}, ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL},
		{"oci layout", []tarFile{
			{"blobs/sha256/abc", layer},
			{"index.json", []byte(`{"schemaVersion":2}`)},
			{"./oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		}, ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_OCI_LAYOUT_TAR},
		{"oci layout in a directory", []tarFile{
			{"img/oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
			{"img/blobs/sha256/abc", layer},
		}, ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_OCI_LAYOUT_TAR},
		{"docker 25 writes both", []tarFile{
			{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
			{"blobs/sha256/abc", layer},
			{"manifest.json", []byte(`[]`)},
		}, ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, f := newCtrlEnv(t)
			path := writeTar(t, tc.files...)
			stdout, _ := e.call(t, "", "template", "import", "mine", path, "--set-default", "--command-id", "imp-1")

			calls, reqs := f.got()
			if strings.Join(calls, ",") != "ImportTemplateRevision" {
				t.Fatalf("calls = %v", calls)
			}
			want := &ctrlv1.ImportTemplateRevisionStart{
				Command:    &ctrlv1.CommandMetadata{CommandId: "imp-1"},
				TemplateId: "mine",
				Source:     &ctrlv1.ImportTemplateRevisionStart_Archive{Archive: tc.want},
				SetDefault: true,
			}
			if !proto.Equal(reqs[0], want) {
				t.Errorf("start = %v, want %v", reqs[0], want)
			}
			file, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(f.imported, file) {
				t.Errorf("the chunks (%d bytes) are not the file (%d bytes)", len(f.imported), len(file))
			}
			if wantChunks := (len(file) + chunkSize - 1) / chunkSize; f.chunks != wantChunks {
				t.Errorf("%d chunks, want %d of at most 1 MiB", f.chunks, wantChunks)
			}
			if got := f.proto["ImportTemplateRevision"]; got != 2 {
				t.Errorf("import went over HTTP/%d, want HTTP/2 (h2c)", got)
			}
			if got := f.auth["ImportTemplateRevision"]; got != "Bearer tok" {
				t.Errorf("import Authorization = %q, want Bearer tok", got)
			}
			if !strings.Contains(stdout, "sha256-0123456789abcdef") || !strings.Contains(stdout, "true") {
				t.Errorf("stdout = %q", stdout)
			}
		})
	}
}

func TestTemplateImportFormatFlagAndErrors(t *testing.T) {
	e, f := newCtrlEnv(t)
	plain := writeTar(t, tarFile{"etc/hostname", []byte("x")})
	e.call(t, "", "template", "import", "mine", plain, "--format", "oci-archive")
	_, reqs := f.got()
	if got := reqs[0].(*ctrlv1.ImportTemplateRevisionStart).GetArchive(); got != ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_OCI_LAYOUT_TAR {
		t.Errorf("archive = %v, want OCI_LAYOUT_TAR", got)
	}

	gz := writeFile(t, "image.tar.gz", "\x1f\x8b\x08rest")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{plain}, "pass --format"},
		{[]string{gz}, "gzip"},
		{[]string{plain, "--format", "zip"}, "docker-archive or oci-archive"},
		{[]string{plain, "--registry", "debian:12"}, "not both"},
		{[]string{"--registry", "debian:12", "--format", "oci-archive"}, "--format"},
		{[]string{}, "FILE or REF"},
		{[]string{plain, "--platform", "linux/amd64"}, "registry pull, not a FILE"},
		{[]string{"debian:12", "--password-stdin"}, "username"},
		{[]string{filepath.Join(t.TempDir(), "missing.tar")}, "no such file"},
	} {
		_, _, err := e.run(t, "", append([]string{"template", "import", "mine", "--addr", e.addr, "--token", "t"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("import %v: err = %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
	if calls, _ := f.got(); len(calls) != 1 {
		t.Errorf("calls = %v, want only the first import", calls)
	}
}

func TestTemplateImportRegistry(t *testing.T) {
	e, f := newCtrlEnv(t)
	// No docker credentials: an anonymous pull.
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	stdout, _ := e.call(t, "", "template", "import", "mine", "--registry", "docker.io/library/debian:12", "-o", "json")
	_, reqs := f.got()
	start := reqs[0].(*ctrlv1.ImportTemplateRevisionStart)
	if start.GetRegistryReference() != "docker.io/library/debian:12" || start.GetSetDefault() || f.chunks != 0 ||
		start.GetRegistryCredentials() != nil || start.GetPlatform() != "" {
		t.Errorf("start = %v with %d chunks", start, f.chunks)
	}
	var resp ctrlv1.ImportTemplateRevisionResponse
	if err := protojson.Unmarshal([]byte(stdout), &resp); err != nil {
		t.Fatalf("stdout is not an ImportTemplateRevisionResponse: %v\n%s", err, stdout)
	}
	if resp.GetRevision().GetRevision() != "sha256-0123456789abcdef" {
		t.Errorf("response = %v", &resp)
	}
}

// REF as the second argument, with credentials from the flags or from the
// docker config.
func TestTemplateImportRegistryCredentials(t *testing.T) {
	e, f := newCtrlEnv(t)
	docker := t.TempDir()
	t.Setenv("DOCKER_CONFIG", docker)
	auth := base64.StdEncoding.EncodeToString([]byte("bob:from-config"))
	writeFileAt(t, filepath.Join(docker, "config.json"), `{"auths":{"127.0.0.1:5000":{"auth":"`+auth+`"}}}`)

	e.call(t, "s3cret\n", "template", "import", "mine", "127.0.0.1:5000/app:1", "--username", "alice", "--password-stdin",
		"--platform", "linux/arm64/v8")
	e.call(t, "", "template", "import", "mine", "127.0.0.1:5000/app@sha256:"+strings.Repeat("a", 64))
	e.call(t, "", "template", "import", "mine", "registry.example.com/app:1")
	_, reqs := f.got()
	want := []string{
		`127.0.0.1:5000/app:1 linux/arm64/v8 alice:s3cret`,
		`127.0.0.1:5000/app@sha256:` + strings.Repeat("a", 64) + ` bob:from-config`,
		`registry.example.com/app:1 -`,
	}
	for i, r := range reqs {
		s := r.(*ctrlv1.ImportTemplateRevisionStart)
		got := s.GetRegistryReference()
		if s.GetPlatform() != "" {
			got += " " + s.GetPlatform()
		}
		if c := s.GetRegistryCredentials(); c != nil {
			got += " " + c.GetUsername() + ":" + c.GetPassword()
		} else {
			got += " -"
		}
		if got != want[i] {
			t.Errorf("import %d: %s, want %s", i, got, want[i])
		}
	}
}

func writeFileAt(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestDetectFormatRewinds(t *testing.T) {
	f, err := os.Open(writeTar(t, tarFile{"manifest.json", []byte("[]")}))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got, err := detectFormat(f); err != nil || got != ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL {
		t.Fatalf("detectFormat = %v, %v", got, err)
	}
	if off, _ := f.Seek(0, io.SeekCurrent); off != 0 {
		t.Errorf("offset after detection = %d, want 0", off)
	}
}

// template runs `template get id -o json` and returns the Template it
// printed.
func (e *env) template(t *testing.T, id string) *ctrlv1.Template {
	t.Helper()
	var resp ctrlv1.GetTemplateResponse
	e.callJSON(t, &resp, "template", "get", id, "-o", "json")
	return resp.GetTemplate()
}

func TestTemplateGetShowsRevisions(t *testing.T) {
	e := newEnv(t)
	e.srv.AddBuiltinTemplate(t)
	tpl := e.template(t, "base")
	if tpl.GetTemplateId() != "base" || len(tpl.GetRevisions()) != 1 || tpl.GetDefaultRevision() != tpl.GetRevisions()[0].GetRevision() {
		t.Fatalf("template = %v", tpl)
	}
	rev := tpl.GetRevisions()[0]

	stdout, _ := e.call(t, "", "template", "get", "base")
	for _, want := range []string{
		fmt.Sprintf("base %s 1 %d - %s", rev.GetRevision(), tpl.GetRevision(), age(tpl.GetCreatedAt())),
		"REVISION DEFAULT SIZE UNPACKED SOURCE AGE",
		fmt.Sprintf("%s true %s %s %s %s", rev.GetRevision(), approxSize(rev.GetSizeBytes()), approxSize(rev.GetUnpackedBytes()), rev.GetSource(),
			age(rev.GetCreatedAt())),
	} {
		found := false
		for _, l := range strings.Split(stdout, "\n") {
			found = found || strings.Join(strings.Fields(l), " ") == want
		}
		if !found {
			t.Errorf("output lacks the line %q:\n%s", want, stdout)
		}
	}
	for n, want := range map[uint64]string{12900000: "12.3Mi", 40 << 20: "40.0Mi", 1 << 30: "1.0Gi", 0: "0"} {
		if got := approxSize(n); got != want {
			t.Errorf("approxSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestTemplateDefaultReadsRevision(t *testing.T) {
	e := newEnv(t)
	e.srv.AddBuiltinTemplate(t)
	tpl := e.template(t, "base")
	rev := tpl.GetDefaultRevision()
	e.call(t, "", "template", "default", "base", rev)
	calls, _, reqs := e.got()
	if strings.Join(calls, ",") != "GetTemplate,SetTemplateDefault" {
		t.Fatalf("calls = %v", calls)
	}
	if r := reqs[1].(*ctrlv1.SetTemplateDefaultRequest); r.GetExpectedRevision() != tpl.GetRevision() || r.GetDefaultRevision() != rev || r.GetTemplateId() != "base" {
		t.Errorf("request = %v, want expected_revision %d", r, tpl.GetRevision())
	}
	// A stale --expected-revision is sent as given, and refused.
	if _, _, err := e.run(t, "", "template", "default", "base", rev, "--expected-revision", "999", "--addr", e.addr, "--token", e.token); err == nil {
		t.Error("a stale --expected-revision succeeded")
	}
	calls, _, reqs = e.got()
	if strings.Join(calls, ",") != "SetTemplateDefault" || reqs[0].(*ctrlv1.SetTemplateDefaultRequest).GetExpectedRevision() != 999 {
		t.Errorf("calls = %v, requests = %v", calls, reqs)
	}
}

func TestTemplateCreate(t *testing.T) {
	e := newEnv(t)
	e.call(t, "", "template", "create", "mine", "--label", "team=ml")
	_, _, reqs := e.got()
	if r := reqs[0].(*ctrlv1.CreateTemplateRequest); r.GetTemplateId() != "mine" || r.GetLabels()["team"] != "ml" || r.GetCommand().GetCommandId() == "" {
		t.Errorf("request = %v", r)
	}
	if tpl := e.template(t, "mine"); tpl.GetLabels()["team"] != "ml" {
		t.Errorf("stored = %v", tpl)
	}
}
