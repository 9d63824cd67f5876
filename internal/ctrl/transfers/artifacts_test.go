package transfers

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"gocloud.dev/blob/memblob"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/artifact"
)

// TestReceiveStopsVerifyingWhenTheUploadEnds: an upload whose caller went
// away ends at once, though what it sent decompresses to far more than
// the verifier could hash meanwhile (64 GiB of zeros in 7 MiB).
func TestReceiveStopsVerifyingWhenTheUploadEnds(t *testing.T) {
	const frameBytes, frames = 16 << 20, 4096
	body, err := artifact.EncodeManifest(&ctrlv1.TransferManifest{})
	if err != nil {
		t.Fatal(err)
	}
	var headers bytes.Buffer
	tw := tar.NewWriter(&headers)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeReg, Name: artifact.ManifestName, Mode: 0o644, Size: int64(len(body))},
		{Typeflag: tar.TypeDir, Name: artifact.Volume, Mode: 0o755},
		{Typeflag: tar.TypeReg, Name: artifact.Volume + "/zeros", Mode: 0o644, Size: frameBytes * frames},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Name == artifact.ManifestName {
			tw.Write(body)
		}
	}
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Concatenated zstd frames are one stream: the zeros are one frame
	// repeated.
	art := enc.EncodeAll(headers.Bytes(), nil)
	zeros := enc.EncodeAll(make([]byte, frameBytes), nil)
	art = append(art, bytes.Repeat(zeros, frames)...)
	t.Logf("%d bytes of artifact sent before its uploader goes away", len(art))

	bucket := memblob.OpenBucket(nil)
	defer bucket.Close()
	// The uploader goes away once it sent it: the request's context ends
	// (and so does the stream it reads).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(time.Second, cancel)
	done := make(chan error, 1)
	go func() {
		_, err := receive(ctx, bucket, "tr_1", io.MultiReader(bytes.NewReader(art), contextReader{ctx}), nil)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("receive = %v, want context.Canceled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("receive still verifies 19 s after its upload ended")
	}
}

// contextReader reads nothing until ctx ends, then fails with its error.
type contextReader struct{ ctx context.Context }

func (c contextReader) Read([]byte) (int, error) {
	<-c.ctx.Done()
	return 0, c.ctx.Err()
}
