package dataplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// readAll reads a file through ReadFile.
func (e *testEnv) readAll(ctx context.Context, path, user string) ([]byte, int, error) {
	stream, err := e.fc.ReadFile(ctx, connect.NewRequest(&datav1.ReadFileRequest{Path: path, User: user}))
	if err != nil {
		return nil, 0, err
	}
	var buf bytes.Buffer
	msgs := 0
	for stream.Receive() {
		buf.Write(stream.Msg().GetData())
		msgs++
	}
	return buf.Bytes(), msgs, stream.Err()
}

// write writes a file through WriteFile: start, chunks, commit.
func (e *testEnv) write(ctx context.Context, start *datav1.WriteFileStart, chunks ...string) (*datav1.FileInfo, error) {
	return e.writeMsgs(ctx, start, true, chunks...)
}

// writeMsgs sends start and chunks, then commit if commit is set, and
// ends the stream normally.
func (e *testEnv) writeMsgs(ctx context.Context, start *datav1.WriteFileStart, commit bool, chunks ...string) (*datav1.FileInfo, error) {
	stream := e.fc.WriteFile(ctx)
	msgs := []*datav1.WriteFileRequest{{Part: &datav1.WriteFileRequest_Start{Start: start}}}
	for _, c := range chunks {
		msgs = append(msgs, &datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Data{Data: []byte(c)}})
	}
	if commit {
		msgs = append(msgs, &datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Commit{Commit: true}})
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the answer tells why
		}
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return resp.Msg.GetFile(), nil
}

func TestReadLargeFile(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 60*time.Second)
	path := filepath.Join(t.TempDir(), "big")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	rng := rand.NewChaCha8([32]byte{1})
	if _, err := io.CopyN(io.MultiWriter(f, h), rng, 64<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := h.Sum(nil)

	stream, err := e.fc.ReadFile(ctx, connect.NewRequest(&datav1.ReadFileRequest{Path: path}))
	if err != nil {
		t.Fatal(err)
	}
	h.Reset()
	n, msgs := 0, 0
	for stream.Receive() {
		d := stream.Msg().GetData()
		if len(d) > readChunk {
			t.Fatalf("message of %d bytes", len(d))
		}
		h.Write(d)
		n += len(d)
		msgs++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 64<<20 || !bytes.Equal(h.Sum(nil), want) {
		t.Fatalf("read %d bytes, sha256 mismatch: %v", n, !bytes.Equal(h.Sum(nil), want))
	}
	if msgs != (64<<20)/readChunk {
		t.Fatalf("%d messages, want %d", msgs, (64<<20)/readChunk)
	}
}

func TestPermissionAsUser(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := sharedDir(t)
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _, err := e.readAll(ctx, secret, ""); err != nil || string(got) != "root only" {
		t.Fatalf("as root: %q, %v", got, err)
	}
	_, _, err := e.readAll(ctx, secret, "nobody")
	wantCode(t, err, connect.CodePermissionDenied, stageReadingFile)
	_, err = e.write(ctx, &datav1.WriteFileStart{Path: secret, User: "nobody"}, "x")
	wantCode(t, err, connect.CodePermissionDenied, stageWritingFile)
	_, err = e.fc.DeleteFile(ctx, connect.NewRequest(&datav1.DeleteFileRequest{Path: secret, User: "nobody"}))
	wantCode(t, err, connect.CodePermissionDenied, stageDeletingFile)
	// A directory only root may write.
	_, err = e.write(ctx, &datav1.WriteFileStart{Path: filepath.Join(dir, "new"), User: "nobody"}, "x")
	wantCode(t, err, connect.CodePermissionDenied, stageWritingFile)

	// In a directory nobody owns, nobody creates files that nobody owns.
	own := filepath.Join(dir, "own")
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	info, err := e.write(ctx, &datav1.WriteFileStart{Path: filepath.Join(own, "f"), User: "nobody", Mode: 0o640}, "mine")
	if err != nil {
		t.Fatal(err)
	}
	if info.GetOwner() != "nobody" || info.GetMode() != 0o640 || info.GetSize() != 4 || info.GetType() != datav1.FileType_FILE_TYPE_FILE {
		t.Fatalf("written file: %v", info)
	}
	st, _ := os.Stat(filepath.Join(own, "f"))
	if s := st.Sys().(*syscall.Stat_t); s.Uid != 65534 || s.Gid != 65534 {
		t.Fatalf("owner %d:%d", s.Uid, s.Gid)
	}
	d, err := e.fc.CreateDirectory(ctx, connect.NewRequest(&datav1.CreateDirectoryRequest{Path: filepath.Join(own, "a/b"), User: "nobody", Parents: true, Mode: 0o700}))
	if err != nil {
		t.Fatal(err)
	}
	if d.Msg.GetDirectory().GetOwner() != "nobody" || d.Msg.GetDirectory().GetMode() != 0o700 {
		t.Fatalf("directory: %v", d.Msg.GetDirectory())
	}
	// The agent thread's credentials were restored: root reads again.
	if _, _, err := e.readAll(ctx, secret, ""); err != nil {
		t.Fatalf("as root after nobody: %v", err)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	leftovers := func() []string {
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			if e.Name() != "f" {
				names = append(names, e.Name())
			}
		}
		return names
	}

	// writing reports whether this process (the server) holds a new
	// file of dir open: unnamed (O_TMPFILE), it shows as "dir/#INODE
	// (deleted)", and nothing of it is in the directory, so a write cut
	// short by a crash leaves nothing there.
	writing := func() bool {
		fds, _ := os.ReadDir("/proc/self/fd")
		for _, fd := range fds {
			if l, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); strings.HasPrefix(l, dir+"/#") {
				return true
			}
		}
		return false
	}

	// A stream that breaks off mid-way.
	cctx, cancel := context.WithCancel(ctx)
	stream := e.fc.WriteFile(cctx)
	stream.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Start{Start: &datav1.WriteFileStart{Path: path}}})
	stream.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Data{Data: []byte("new, but ")}})
	deadline := time.Now().Add(5 * time.Second)
	for !writing() {
		if time.Now().After(deadline) {
			t.Fatal("the server writes no unnamed file")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if left := leftovers(); len(left) > 0 {
		t.Errorf("a write in progress shows in the directory: %v", left)
	}
	// Cancelling resets the HTTP/2 stream.
	cancel()
	for writing() || len(leftovers()) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("temp files left: %v", leftovers())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := stream.CloseAndReceive(); err == nil {
		t.Fatal("cancelled write succeeded")
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Fatalf("after a broken write: %q", b)
	}

	// A stream that errors: start twice.
	s2 := e.fc.WriteFile(ctx)
	s2.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Start{Start: &datav1.WriteFileStart{Path: path}}})
	s2.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Data{Data: []byte("partial")}})
	s2.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Start{Start: &datav1.WriteFileStart{Path: path}}})
	_, err := s2.CloseAndReceive()
	wantCode(t, err, connect.CodeInvalidArgument, stageWritingFile)
	if b, _ := os.ReadFile(path); string(b) != "old" || len(leftovers()) > 0 {
		t.Fatalf("after a bad stream: %q, left %v", b, leftovers())
	}

	// A stream that ends normally but without commit, as an aborted
	// upload's can when its end arrives before its reset, writes nothing.
	_, err = e.writeMsgs(ctx, &datav1.WriteFileStart{Path: path}, false, "cut ", "short")
	wantCode(t, err, connect.CodeAborted, stageWritingFile)
	if b, _ := os.ReadFile(path); string(b) != "old" || len(leftovers()) > 0 {
		t.Fatalf("after a stream without commit: %q, left %v", b, leftovers())
	}
	// A declared size that the data misses, either way, is refused.
	for _, chunks := range [][]string{{"four"}, {"four", "more"}} {
		size := uint64(6)
		_, err = e.write(ctx, &datav1.WriteFileStart{Path: path, Size: &size}, chunks...)
		wantCode(t, err, connect.CodeInvalidArgument, stageWritingFile)
		if b, _ := os.ReadFile(path); string(b) != "old" || len(leftovers()) > 0 {
			t.Fatalf("after a wrong size (%q): %q, left %v", chunks, b, leftovers())
		}
	}
	// Data after commit is refused.
	_, err = e.writeMsgs(ctx, &datav1.WriteFileStart{Path: path}, true, "x")
	if err != nil {
		t.Fatal(err)
	}
	s3 := e.fc.WriteFile(ctx)
	s3.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Start{Start: &datav1.WriteFileStart{Path: path}}})
	s3.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Commit{Commit: true}})
	s3.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Data{Data: []byte("late")}})
	_, err = s3.CloseAndReceive()
	wantCode(t, err, connect.CodeInvalidArgument, stageWritingFile)
	if b, _ := os.ReadFile(path); string(b) != "x" || len(leftovers()) > 0 {
		t.Fatalf("after data past commit: %q, left %v", b, leftovers())
	}
	// The right size commits.
	size := uint64(4)
	if _, err := e.write(ctx, &datav1.WriteFileStart{Path: path, Size: &size}, "si", "ze"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "size" {
		t.Fatalf("after a sized write: %q", b)
	}

	// A good write replaces the content and keeps the mode.
	info, err := e.write(ctx, &datav1.WriteFileStart{Path: path, Mode: 0o755}, "new ", "content")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new content" || info.GetMode() != 0o600 || info.GetSize() != 11 {
		t.Fatalf("after write: %q, %v", b, info)
	}
	// Through a symlink, the target is written and the link stays.
	if err := os.Symlink("f", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.write(ctx, &datav1.WriteFileStart{Path: filepath.Join(dir, "link")}, "via link"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "via link" {
		t.Fatalf("through link: %q", b)
	}
	if fi, _ := os.Lstat(filepath.Join(dir, "link")); fi.Mode()&os.ModeSymlink == 0 {
		t.Fatal("link replaced")
	}
	// A new, empty file gets the default mode.
	info, err = e.write(ctx, &datav1.WriteFileStart{Path: filepath.Join(dir, "empty")})
	if err != nil || info.GetMode() != 0o644 || info.GetSize() != 0 {
		t.Fatalf("empty file: %v, %v", info, err)
	}
	// Errors.
	_, err = e.write(ctx, &datav1.WriteFileStart{Path: dir}, "x")
	wantCode(t, err, connect.CodeFailedPrecondition, stageWritingFile)
	_, err = e.write(ctx, &datav1.WriteFileStart{Path: filepath.Join(dir, "no/such/dir/f")}, "x")
	wantCode(t, err, connect.CodeNotFound, stageWritingFile)
	if !strings.Contains(err.Error(), filepath.Join(dir, "no/such/dir/f")+":") {
		t.Errorf("a write into a directory that is not there: %v, want it named by the file asked for", err)
	}
	_, err = e.write(ctx, &datav1.WriteFileStart{Path: ""}, "x")
	wantCode(t, err, connect.CodeInvalidArgument, stageWritingFile)
	s4 := e.fc.WriteFile(ctx)
	s4.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Data{Data: []byte("x")}})
	_, err = s4.CloseAndReceive()
	wantCode(t, err, connect.CodeInvalidArgument, stageWritingFile)
}

// TestMoveFileMerges: with merge, a directory moved onto a directory
// lands in it entry by entry, keeping what only the destination holds;
// an entry that cannot be moved stops it, named, with the source's rest
// left where it was.
func TestMoveFileMerges(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	j := func(p ...string) string { return filepath.Join(append([]string{dir}, p...)...) }
	for name, data := range map[string]string{"src/sub/new": "new", "src/top": "copied", "dst/sub/mine": "mine", "dst/top": "old"} {
		if err := os.MkdirAll(filepath.Dir(j(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(j(name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	move := func(merge bool) error {
		_, err := e.fc.MoveFile(ctx, connect.NewRequest(&datav1.MoveFileRequest{Source: j("src"), Destination: j("dst"), Merge: merge}))
		return err
	}
	wantCode(t, move(false), connect.CodeAlreadyExists, stageMovingFile)
	if err := move(true); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"dst/sub/new": "new", "dst/sub/mine": "mine", "dst/top": "copied"} {
		if got, err := os.ReadFile(j(name)); string(got) != want {
			t.Errorf("after the merge, %s = %q (%v), want %q", name, got, err, want)
		}
	}
	if _, err := os.Lstat(j("src")); !os.IsNotExist(err) {
		t.Errorf("the merged source is still there: %v", err)
	}
	_, err := e.fc.MoveFile(ctx, connect.NewRequest(&datav1.MoveFileRequest{Source: j("dst"), Destination: j("dst/sub"), Merge: true}))
	wantCode(t, err, connect.CodeInvalidArgument, stageMovingFile)
	if !strings.Contains(err.Error(), "the destination lies inside the source") {
		t.Errorf("a merge into itself: %v, want it said why", err)
	}

	// A file of the source where the destination has a directory.
	if err := os.MkdirAll(j("src"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{"src/a": "a", "src/sub": "a file", "src/z": "z"} {
		if err := os.WriteFile(j(name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err = move(true)
	wantCode(t, err, connect.CodeAlreadyExists, stageMovingFile)
	if !strings.Contains(err.Error(), j("dst/sub")) {
		t.Errorf("the failed merge: %v, want the entry named", err)
	}
	if got, err := os.ReadFile(j("dst/a")); string(got) != "a" {
		t.Errorf("the entry before the failure: %q, %v", got, err)
	}
	if got, err := os.ReadFile(j("src/z")); string(got) != "z" {
		t.Errorf("the entry after the failure: %q, %v, want it left in the source", got, err)
	}
}

func TestFileOperations(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	j := func(p ...string) string { return filepath.Join(append([]string{dir}, p...)...) }

	// CreateDirectory.
	if _, err := e.fc.CreateDirectory(ctx, connect.NewRequest(&datav1.CreateDirectoryRequest{Path: j("a")})); err != nil {
		t.Fatal(err)
	}
	_, err := e.fc.CreateDirectory(ctx, connect.NewRequest(&datav1.CreateDirectoryRequest{Path: j("a")}))
	wantCode(t, err, connect.CodeAlreadyExists, stageCreatingDirectory)
	_, err = e.fc.CreateDirectory(ctx, connect.NewRequest(&datav1.CreateDirectoryRequest{Path: j("x/y")}))
	wantCode(t, err, connect.CodeNotFound, stageCreatingDirectory)
	d, err := e.fc.CreateDirectory(ctx, connect.NewRequest(&datav1.CreateDirectoryRequest{Path: j("a/b/c"), Parents: true, Mode: 0o750}))
	if err != nil {
		t.Fatal(err)
	}
	if d.Msg.GetDirectory().GetType() != datav1.FileType_FILE_TYPE_DIRECTORY || d.Msg.GetDirectory().GetMode() != 0o750 {
		t.Fatalf("created: %v", d.Msg.GetDirectory())
	}
	if _, err := e.fc.CreateDirectory(ctx, connect.NewRequest(&datav1.CreateDirectoryRequest{Path: j("a/b"), Parents: true})); err != nil {
		t.Fatalf("mkdir -p of an existing directory: %v", err)
	}
	for name, content := range map[string]string{"a/z": "zz", "a/b/f": "f", "a/m": "m"} {
		if err := os.WriteFile(j(name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err = e.fc.CreateDirectory(ctx, connect.NewRequest(&datav1.CreateDirectoryRequest{Path: j("a/z/q"), Parents: true}))
	wantCode(t, err, connect.CodeFailedPrecondition, stageCreatingDirectory)
	if err := os.Symlink("b/f", j("a/l")); err != nil {
		t.Fatal(err)
	}

	// ListDirectory: depth-first in name order.
	list := func(depth uint32) []string {
		t.Helper()
		resp, err := e.fc.ListDirectory(ctx, connect.NewRequest(&datav1.ListDirectoryRequest{Path: j("a"), Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, fi := range resp.Msg.GetEntries() {
			rel, _ := filepath.Rel(j("a"), fi.GetPath())
			if rel != filepath.Join(filepath.Dir(rel), fi.GetName()) {
				t.Fatalf("path %s, name %s", fi.GetPath(), fi.GetName())
			}
			got = append(got, rel)
		}
		return got
	}
	if got, want := list(0), []string{"b", "l", "m", "z"}; !slices.Equal(got, want) {
		t.Fatalf("depth 0: %v, want %v", got, want)
	}
	if got, want := list(3), []string{"b", "b/c", "b/f", "l", "m", "z"}; !slices.Equal(got, want) {
		t.Fatalf("depth 3: %v, want %v", got, want)
	}
	_, err = e.fc.ListDirectory(ctx, connect.NewRequest(&datav1.ListDirectoryRequest{Path: j("a/z")}))
	wantCode(t, err, connect.CodeFailedPrecondition, stageReadingFile)

	// InspectFile does not follow a final symlink.
	in, err := e.fc.InspectFile(ctx, connect.NewRequest(&datav1.InspectFileRequest{Path: j("a/l")}))
	if err != nil {
		t.Fatal(err)
	}
	if fi := in.Msg.GetFile(); fi.GetType() != datav1.FileType_FILE_TYPE_SYMLINK || fi.GetSymlinkTarget() != "b/f" || fi.GetOwner() != "root" || fi.GetGroup() != "root" {
		t.Fatalf("inspect link: %v", fi)
	}
	_, err = e.fc.InspectFile(ctx, connect.NewRequest(&datav1.InspectFileRequest{Path: j("nope")}))
	wantCode(t, err, connect.CodeNotFound, stageInspectingFile)

	// MoveFile.
	mv, err := e.fc.MoveFile(ctx, connect.NewRequest(&datav1.MoveFileRequest{Source: j("a/z"), Destination: j("a/y")}))
	if err != nil {
		t.Fatal(err)
	}
	if mv.Msg.GetFile().GetName() != "y" || mv.Msg.GetFile().GetSize() != 2 {
		t.Fatalf("moved: %v", mv.Msg.GetFile())
	}
	_, err = e.fc.MoveFile(ctx, connect.NewRequest(&datav1.MoveFileRequest{Source: j("a/z"), Destination: j("a/w")}))
	wantCode(t, err, connect.CodeNotFound, stageMovingFile)
	_, err = e.fc.MoveFile(ctx, connect.NewRequest(&datav1.MoveFileRequest{Source: j("a/y"), Destination: j("a/b")}))
	wantCode(t, err, connect.CodeAlreadyExists, stageMovingFile) // onto a directory

	// ReadFile of a directory, of nothing.
	_, _, err = e.readAll(ctx, j("a"), "")
	wantCode(t, err, connect.CodeFailedPrecondition, stageReadingFile)
	_, _, err = e.readAll(ctx, j("nope"), "")
	wantCode(t, err, connect.CodeNotFound, stageReadingFile)
	_, _, err = e.readAll(ctx, j("a/m/x"), "")
	wantCode(t, err, connect.CodeFailedPrecondition, stageReadingFile) // ENOTDIR
	if b, msgs, err := e.readAll(ctx, j("a/m"), ""); err != nil || string(b) != "m" || msgs != 1 {
		t.Fatalf("read m: %q %d %v", b, msgs, err)
	}

	// DeleteFile.
	_, err = e.fc.DeleteFile(ctx, connect.NewRequest(&datav1.DeleteFileRequest{Path: j("a")}))
	wantCode(t, err, connect.CodeFailedPrecondition, stageDeletingFile) // ENOTEMPTY
	if _, err := e.fc.DeleteFile(ctx, connect.NewRequest(&datav1.DeleteFileRequest{Path: j("a/b/c")})); err != nil {
		t.Fatalf("delete empty dir: %v", err)
	}
	if _, err := e.fc.DeleteFile(ctx, connect.NewRequest(&datav1.DeleteFileRequest{Path: j("a/l")})); err != nil {
		t.Fatalf("delete link: %v", err)
	}
	if _, err := os.Stat(j("a/b/f")); err != nil {
		t.Fatalf("deleting a link removed its target: %v", err)
	}
	if _, err := e.fc.DeleteFile(ctx, connect.NewRequest(&datav1.DeleteFileRequest{Path: j("a"), Recursive: true})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(j("a")); !os.IsNotExist(err) {
		t.Fatalf("a still there: %v", err)
	}
	_, err = e.fc.DeleteFile(ctx, connect.NewRequest(&datav1.DeleteFileRequest{Path: j("a"), Recursive: true}))
	wantCode(t, err, connect.CodeNotFound, stageDeletingFile)
	_, err = e.fc.DeleteFile(ctx, connect.NewRequest(&datav1.DeleteFileRequest{Path: "/", Recursive: true}))
	wantCode(t, err, connect.CodeInvalidArgument, stageDeletingFile)

	// A relative path is relative to the user's home (root: /root).
	in, err = e.fc.InspectFile(ctx, connect.NewRequest(&datav1.InspectFileRequest{Path: "."}))
	if err != nil || in.Msg.GetFile().GetPath() != "/root" {
		t.Fatalf("inspect .: %v %v", in, err)
	}
	_, err = e.fc.InspectFile(ctx, connect.NewRequest(&datav1.InspectFileRequest{Path: "/", User: "no-such-user-kibotos"}))
	wantCode(t, err, connect.CodeInvalidArgument, stageInspectingFile)
	if !strings.HasPrefix(dir, "/") {
		t.Fatal(dir)
	}
}

// TestWriteRunningProgram replaces a program while it runs, which an
// in-place write could not (ETXTBSY).
func TestWriteRunningProgram(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	prog := filepath.Join(t.TempDir(), "prog")
	sleep, err := os.ReadFile("/bin/sleep")
	if err != nil {
		t.Skip(err)
	}
	if err := os.WriteFile(prog, sleep, 0o755); err != nil {
		t.Fatal(err)
	}
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{prog, "10"}}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	info, err := e.write(ctx, &datav1.WriteFileStart{Path: prog}, "#!/bin/sh\necho new\n")
	if err != nil {
		t.Fatal(err)
	}
	if info.GetMode() != 0o755 {
		t.Fatalf("mode %#o", info.GetMode())
	}
}

// TestReadFileInfo checks the metadata in ReadFile's first message: that
// of the file read, a symlink's target's for a symlink, and present for
// an empty file too.
func TestReadFileInfo(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tool"), []byte("#!/bin/sh\n"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("tool", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, data string
		mode       uint32
	}{
		{"link", "#!/bin/sh\n", 0o750},
		{"tool", "#!/bin/sh\n", 0o750},
		{"empty", "", 0o600},
	} {
		path := filepath.Join(dir, tc.name)
		stream, err := e.fc.ReadFile(ctx, connect.NewRequest(&datav1.ReadFileRequest{Path: path}))
		if err != nil {
			t.Fatal(err)
		}
		var data []byte
		var infos []*datav1.FileInfo
		for stream.Receive() {
			data = append(data, stream.Msg().GetData()...)
			if f := stream.Msg().GetFile(); f != nil {
				infos = append(infos, f)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if string(data) != tc.data || len(infos) != 1 {
			t.Fatalf("%s: %q with %d infos", tc.name, data, len(infos))
		}
		f := infos[0]
		if f.GetType() != datav1.FileType_FILE_TYPE_FILE || f.GetMode() != tc.mode || f.GetSize() != uint64(len(tc.data)) || f.GetPath() != path {
			t.Errorf("%s: %v, want a file of mode %#o and %d bytes", tc.name, f, tc.mode, len(tc.data))
		}
	}
}

// TestWriteFileNames: a file of the longest name a directory holds is
// written (a temporary name made from it would not fit), and a write the
// disk cannot hold names the file asked for, not a temporary one.
func TestWriteFileNames(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	long := filepath.Join(dir, strings.Repeat("a", 255))
	if _, err := e.write(ctx, &datav1.WriteFileStart{Path: long}, "long"); err != nil {
		t.Fatalf("a name of 255 bytes: %v", err)
	}
	if b, err := os.ReadFile(long); err != nil || string(b) != "long" {
		t.Errorf("the file of a long name: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the directory holds %d entries, want the file alone", len(ents))
	}

	full := t.TempDir()
	hosttest.Tmpfs(t, full, "1m")
	_, err := e.write(ctx, &datav1.WriteFileStart{Path: filepath.Join(full, "big")}, strings.Repeat("x", 2<<20))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), full+"/big:") {
		t.Errorf("a write the disk cannot hold: %v, want resource_exhausted naming %s/big", err, full)
	}
	if ents, _ := os.ReadDir(full); len(ents) != 0 {
		t.Errorf("a failed write left %v", ents)
	}
}

// TestNamesThatAreNotUTF8: a directory holding a name that is not UTF-8
// (which a guest's own programs may make) is listed and watched with
// U+FFFD in place of the invalid bytes, as is a symlink's target, where
// such a name used to fail the whole call; a path that is not UTF-8 is
// refused before anything is written.
func TestNamesThatAreNotUTF8(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a\xff\xfe"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("t\xff", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	resp, err := e.fc.ListDirectory(ctx, connect.NewRequest(&datav1.ListDirectoryRequest{Path: dir}))
	if err != nil {
		t.Fatalf("listing a directory with a name that is not UTF-8: %v", err)
	}
	var names []string
	for _, f := range resp.Msg.Entries {
		names = append(names, f.GetName()+" "+f.GetSymlinkTarget())
	}
	if !slices.Equal(names, []string{"a\uFFFD ", "l t\uFFFD"}) {
		t.Errorf("listed %q", names)
	}
	info, err := e.fc.InspectFile(ctx, connect.NewRequest(&datav1.InspectFileRequest{Path: filepath.Join(dir, "l")}))
	if err != nil || info.Msg.GetFile().GetSymlinkTarget() != "t\uFFFD" {
		t.Errorf("inspecting a link to a name that is not UTF-8: %v, %v", info, err)
	}

	stream := startWatch(t, e, ctx, dir, false)
	defer stream.Close()
	if err := os.WriteFile(filepath.Join(dir, "b\xff"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for stream.Receive() {
		if strings.HasSuffix(stream.Msg().GetPath(), "/b\uFFFD") {
			break
		}
	}
	if err := stream.Err(); err != nil {
		t.Errorf("watching a directory where a name that is not UTF-8 appears: %v", err)
	}

	h1 := &http.Transport{DialContext: e.dial}
	defer h1.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPut, "http://guest"+guestabi.FileBytesPath+"?path="+url.QueryEscape(filepath.Join(dir, "c\xff")), strings.NewReader("y"))
	if resp, body := testutil.Do(t, &http.Client{Transport: h1}, req); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "not UTF-8") {
		t.Errorf("PUT of a path that is not UTF-8: %s %s", resp.Status, body)
	}
	if _, err := os.Lstat(filepath.Join(dir, "c\xff")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused PUT wrote the file: %v", err)
	}
}

// TestListingBoundedInSize: a directory of fewer entries than a listing's
// bound whose answer would still pass the SDKs' 64 MiB a message (long
// symlink targets) is refused as too large, saying how to list it, rather
// than sent for the caller to refuse.
func TestListingBoundedInSize(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 60*time.Second)
	dir := t.TempDir()
	target := "/" + strings.Repeat("t", 4000)
	for i := range 14_000 { // about 56 MB of answer
		if err := os.Symlink(target, filepath.Join(dir, fmt.Sprintf("l%05d", i))); err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.fc.ListDirectory(ctx, connect.NewRequest(&datav1.ListDirectoryRequest{Path: dir}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "48 MiB: the directory itself holds more") {
		t.Fatalf("listing 14,000 entries of 4 KB: %v, want resource_exhausted saying how to list them", err)
	}
}
