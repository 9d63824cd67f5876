package dataplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// watchEvents reads n events of a watch as "TYPE relpath".
func watchEvents(t *testing.T, stream *connect.ServerStreamForClient[datav1.WatchDirectoryResponse], dir string, n int) []string {
	t.Helper()
	var got []string
	for len(got) < n && stream.Receive() {
		rel, _ := filepath.Rel(dir, stream.Msg().GetPath())
		got = append(got, fmt.Sprintf("%s %s", stream.Msg().GetType().String()[len("FILE_EVENT_TYPE_"):], rel))
	}
	if len(got) < n {
		t.Fatalf("watch ended after %v: %v", got, stream.Err())
	}
	return got
}

// startWatch watches dir and returns once the watch is in place.
func startWatch(t *testing.T, e *testEnv, ctx context.Context, dir string, recursive bool) *connect.ServerStreamForClient[datav1.WatchDirectoryResponse] {
	t.Helper()
	stream, err := e.fc.WatchDirectory(ctx, connect.NewRequest(&datav1.WatchDirectoryRequest{Path: dir, Recursive: recursive}))
	if err != nil {
		t.Fatal(err)
	}
	stream.ResponseHeader()
	return stream
}

func TestWatchDirectory(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	stream := startWatch(t, e, ctx, dir, false)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	f, err := os.Create(a)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("x"))
	f.Close()
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	got := watchEvents(t, stream, dir, 5)
	want := []string{"CREATE a", "WRITE a", "RENAME a", "CREATE b", "REMOVE b"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	// Removing the directory itself ends the stream.
	os.Remove(dir)
	got = watchEvents(t, stream, dir, 1)
	if got[0] != "REMOVE ." {
		t.Fatalf("after removing the directory: %v", got)
	}
	if stream.Receive() || stream.Err() != nil {
		t.Fatalf("stream goes on: %v %v", stream.Msg(), stream.Err())
	}
}

func TestWatchRecursive(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "old/deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	stream := startWatch(t, e, ctx, dir, true)
	// A subdirectory that existed before the watch.
	if err := os.WriteFile(filepath.Join(dir, "old/deep/f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := watchEvents(t, stream, dir, 1); got[0] != "CREATE old/deep/f" {
		t.Fatalf("in an old subdirectory: %v", got)
	}
	// A new subdirectory: its watch is added when it appears.
	if err := os.Mkdir(filepath.Join(dir, "new"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := watchEvents(t, stream, dir, 1); got[0] != "CREATE new" {
		t.Fatalf("new directory: %v", got)
	}
	if err := os.WriteFile(filepath.Join(dir, "new/g"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := watchEvents(t, stream, dir, 1); got[0] != "CREATE new/g" {
		t.Fatalf("in a new subdirectory: %v", got)
	}

	// Errors.
	s, _ := e.fc.WatchDirectory(ctx, connect.NewRequest(&datav1.WatchDirectoryRequest{Path: filepath.Join(dir, "nope")}))
	s.Receive()
	wantCode(t, s.Err(), connect.CodeNotFound, stageWatchingDirectory)
	s.Close()
	s, _ = e.fc.WatchDirectory(ctx, connect.NewRequest(&datav1.WatchDirectoryRequest{Path: filepath.Join(dir, "new/g")}))
	s.Receive()
	wantCode(t, s.Err(), connect.CodeFailedPrecondition, stageWatchingDirectory)
	s.Close()
	stream.Close()
}

// TestWatchPassesOverWriteTemporaries: a file written through WriteFile
// appears to a watch as its CREATE (the rename into place), without the
// events of the temporary file it is written to first.
func TestWatchPassesOverWriteTemporaries(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	dir := t.TempDir()
	stream := startWatch(t, e, ctx, dir, false)
	w := e.fc.WriteFile(ctx)
	for _, part := range []*datav1.WriteFileRequest{
		{Part: &datav1.WriteFileRequest_Start{Start: &datav1.WriteFileStart{Path: filepath.Join(dir, "f")}}},
		{Part: &datav1.WriteFileRequest_Data{Data: []byte("bytes")}},
		{Part: &datav1.WriteFileRequest_Commit{Commit: true}},
	} {
		if err := w.Send(part); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "z"), nil, 0o644); err != nil { // the last event
		t.Fatal(err)
	}
	var got []string
	for !slices.Contains(got, "CREATE z") {
		got = append(got, watchEvents(t, stream, dir, 1)...)
	}
	// A temporary file is named .kibotos-<hex>, or where the filesystem
	// makes unnamed files (O_TMPFILE) inotify names it #<inode>: no event
	// may name either, or any file but f and z.
	if !slices.Contains(got, "CREATE f") || slices.ContainsFunc(got, func(ev string) bool { name := strings.Fields(ev)[1]; return name != "f" && name != "z" }) {
		t.Errorf("events %v; want CREATE f and no temporary file's", got)
	}
	if isUnnamed(filepath.Join(dir, "#1x")) || isUnnamed(filepath.Join(dir, "#")) {
		t.Error("isUnnamed takes a name other than #<digits> for an unnamed file")
	}
	if err := os.WriteFile(filepath.Join(dir, "#13"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if isUnnamed(filepath.Join(dir, "#13")) || !isUnnamed(filepath.Join(dir, "#14")) {
		t.Error("isUnnamed tells an existing #13 or a missing #14 wrongly")
	}

	// A user's file named #<digits> keeps its events, once it is gone too.
	if err := os.WriteFile(filepath.Join(dir, "#42"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "#42"), filepath.Join(dir, "#43")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "#43")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "end"), nil, 0o644); err != nil { // the last event
		t.Fatal(err)
	}
	got = nil
	for !slices.Contains(got, "CREATE end") {
		got = append(got, watchEvents(t, stream, dir, 1)...)
	}
	for _, want := range []string{"CREATE #42", "RENAME #42", "CREATE #43", "REMOVE #43"} {
		if !slices.Contains(got, want) {
			t.Errorf("events %v; want %s of a user's file", got, want)
		}
	}
	if isTemp(filepath.Join(dir, ".f.kibotos-zz")) || isTemp(filepath.Join(dir, "f.kibotos-0123456789ab")) || !isTemp(filepath.Join(dir, ".f.kibotos-0123456789ab")) {
		t.Error("isTemp tells temporary files from others wrongly")
	}
}

// TestWatchEndsWhenTheGuestStops: a watch the guest agent's stop ends
// (FileService.Close) ends with unavailable, not as if the caller had
// ended it.
func TestWatchEndsWhenTheGuestStops(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	stream := startWatch(t, e, ctx, t.TempDir(), false)
	defer stream.Close()
	e.files.Close()
	for stream.Receive() {
	}
	wantCode(t, stream.Err(), connect.CodeUnavailable, stageWatchingDirectory)
}
