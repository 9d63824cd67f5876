package imagestore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestGarbageCollection: blobs of images no longer kept, and then their
// unpacked layers, are removed (also by a Store opened afresh on the
// directory, as after a restart); what is kept, in use, or touched since the
// cutoff stays, and stale staging leftovers go.
func TestGarbageCollection(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	shared := tarLayer(t, fileE("shared", "in both images"))
	gone := must(s.ImportArchive(ctx, bytes.NewReader(writeArchive(t, testImage(t, "amd64", shared, tarLayer(t, fileE("a", "only in the deleted image")))))))(t)
	live := must(s.ImportArchive(ctx, bytes.NewReader(writeArchive(t, testImage(t, "amd64", shared, tarLayer(t, fileE("b", "only in the live image")))))))(t)
	for _, img := range []Image{gone, live} {
		if _, err := s.Unpack(ctx, img, nil); err != nil {
			t.Fatal(err)
		}
	}
	keepBlobs := map[string]bool{}
	for _, b := range live.Blobs() {
		keepBlobs[b] = true
	}
	// Everything was last committed or used two hours ago.
	old := time.Now().Add(-2 * time.Hour)
	for _, d := range []string{s.blobDir(), s.layerDir()} {
		for _, name := range dirEntries(t, d) {
			if err := os.Chtimes(filepath.Join(d, name), old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := old.Add(-time.Hour)
	after := time.Now().Add(-time.Hour)

	// Nothing older than the cutoff: nothing goes.
	if removed, err := s.RemoveBlobs(keepBlobs, before); err != nil || len(removed) != 0 {
		t.Fatalf("RemoveBlobs with an earlier cutoff removed %v, %v", removed, err)
	}
	// A crash's leftovers in tmp/: an old one goes, also when the image
	// dated a file of it in the future (that counts by when it was
	// written); a fresh one stays.
	stale, future, fresh := filepath.Join(s.tmpDir(), "unpack-stale"), filepath.Join(s.tmpDir(), "unpack-future"), filepath.Join(s.tmpDir(), "import-fresh")
	for _, d := range []string{stale, future} {
		if err := os.MkdirAll(filepath.Join(d, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{filepath.Join(stale, "sub"), stale, future} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	tomorrow := time.Now().Add(24 * time.Hour)
	if err := os.Chtimes(filepath.Join(future, "sub"), tomorrow, tomorrow); err != nil {
		t.Fatal(err)
	}
	tmpCutoff := time.Now()
	time.Sleep(10 * time.Millisecond)
	if err := os.MkdirAll(filepath.Join(fresh, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}

	// After a restart, the deleted image's blobs go, the live one's stay.
	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	removed, err := s.RemoveBlobs(keepBlobs, tmpCutoff)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.DeleteFunc(gone.Blobs(), func(d string) bool { return keepBlobs[d] })
	slices.Sort(want)
	slices.Sort(removed)
	if len(want) != 3 || !slices.Equal(removed, want) {
		t.Errorf("removed blobs %v, want %v", removed, want)
	}
	if removed, err = s.RemoveBlobs(keepBlobs, after); err != nil || len(removed) != 0 {
		t.Errorf("second pass removed %v, %v", removed, err)
	}
	for _, b := range live.Blobs() {
		if !s.HasBlob(b) {
			t.Errorf("live blob %s removed", b)
		}
	}
	if names := dirEntries(t, s.tmpDir()); !slices.Equal(names, []string{"import-fresh"}) {
		t.Errorf("tmp holds %v, want only the fresh leftover", names)
	}

	onlyGone := gone.Layers[1].DiffID
	// A layer an execution uses stays though its blob is gone.
	if removed, err := s.RemoveLayers(map[string]bool{onlyGone: true}, after); err != nil || len(removed) != 0 {
		t.Errorf("RemoveLayers removed %v (%v) though the layer is in use", removed, err)
	}
	// A layer used since the cutoff stays.
	if removed, err := s.RemoveLayers(nil, before); err != nil || len(removed) != 0 {
		t.Errorf("RemoveLayers removed %v (%v) though used since the cutoff", removed, err)
	}
	// Unused: only the layer whose blob is gone is removed.
	if removed, err := s.RemoveLayers(nil, after); err != nil || !slices.Equal(removed, []string{onlyGone}) {
		t.Errorf("RemoveLayers removed %v (%v), want %s", removed, err, onlyGone)
	}
	dirs, err := s.Unpack(ctx, live, nil)
	if err != nil {
		t.Fatalf("the live image after collection: %v", err)
	}
	for i, f := range []string{"shared", "b"} {
		if _, err := os.Stat(filepath.Join(dirs[i], f)); err != nil {
			t.Error(err)
		}
	}
	if _, err := s.Unpack(ctx, gone, nil); err == nil {
		t.Error("the deleted image still unpacks")
	}
	if n := len(dirEntries(t, s.layerDir())); n != 2*3 {
		t.Errorf("layers/ holds %d entries, want the live image's 2 layers with their 2 marks each", n)
	}
}

// TestUnpackRefreshesUse: each Unpack of a layer already unpacked moves its
// last use to now, so that a collection with a cutoff before that Unpack
// spares it though its blob is gone; the mark still names the blob.
func TestUnpackRefreshesUse(t *testing.T) {
	ctx := context.Background()
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	img := must(s.ImportArchive(ctx, bytes.NewReader(writeArchive(t, testImage(t, "amd64", tarLayer(t, fileE("a", "a")))))))(t)
	if _, err := s.Unpack(ctx, img, nil); err != nil {
		t.Fatal(err)
	}
	layer, _ := parseDigest(img.Layers[0].DiffID)
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(s.blobRefPath(layer), old, old); err != nil {
		t.Fatal(err)
	}
	cutoff := time.Now().Add(-time.Minute)
	if _, err := s.Unpack(ctx, img, nil); err != nil {
		t.Fatal(err)
	}
	if used, err := s.lastUse(layer); err != nil || !used.After(cutoff) {
		t.Fatalf("last use %v (%v) after a second Unpack, want after %v", used, err, cutoff)
	}
	if b, err := os.ReadFile(s.blobRefPath(layer)); err != nil || string(b) != img.Layers[0].Digest+"\n" {
		t.Fatalf("mark %q (%v), want the blob's digest", b, err)
	}
	if _, err := s.RemoveBlobs(nil, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if removed, err := s.RemoveLayers(nil, cutoff); err != nil || len(removed) != 0 {
		t.Errorf("RemoveLayers removed %v (%v) though Unpack returned it after the cutoff", removed, err)
	}
}
