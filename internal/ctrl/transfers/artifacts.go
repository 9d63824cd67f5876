package transfers

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/artifact"
)

// Keys of the blob store: a committed artifact lives under
// transfers/<transfer ID>, an upload in progress under
// transfers-staging/<transfer ID>/<random>.
const (
	artifactPrefix = "transfers/"
	stagingPrefix  = "transfers-staging/"
)

func artifactKey(id string) string { return artifactPrefix + id }

// stagingKey is a new temporary key of the Transfer's artifact: flat, as
// a directory blob store never removes the directories of its keys.
func stagingKey(id string) string {
	var b [8]byte
	rand.Read(b[:])
	return stagingPrefix + id + "." + hex.EncodeToString(b[:])
}

// errVerified ends the verifier's side of the pipe.
var errVerified = errors.New("verification ended")

// received is an artifact staged and verified.
type received struct {
	staged   string
	manifest *ctrlv1.TransferManifest
	size     uint64
	digest   string
}

// receive streams src into a staging blob of the Transfer id while
// verifying it as an artifact (artifact.Walk, in step with the upload),
// and hashing it. progress is told the bytes received so far. On any
// error the staging blob is gone; an error about the content wraps
// artifact.ErrInvalid.
func receive(ctx context.Context, bucket *blob.Bucket, id string, src io.Reader, progress func(uint64)) (received, error) {
	rec := received{staged: stagingKey(id)}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := bucket.NewWriter(wctx, rec.staged, &blob.WriterOptions{ContentType: "application/zstd"})
	if err != nil {
		return rec, err
	}
	pr, pw := io.Pipe()
	walked := make(chan error, 1)
	go func() {
		// Until the upload ends (wctx): what was sent may decompress to
		// far more than the verifier could go through meanwhile.
		m, err := artifact.Walk(wctx, pr, nil)
		rec.manifest = m
		if err == nil {
			if extra, _ := io.Copy(io.Discard, pr); extra > 0 {
				err = fmt.Errorf("%w: data follows its end", artifact.ErrInvalid)
			}
		}
		pr.CloseWithError(errVerified) // the upload stops at once
		walked <- err
	}()
	h := sha256.New()
	var n uint64
	buf := make([]byte, 1<<20)
	var copyErr error
	for {
		k, rerr := src.Read(buf)
		if k > 0 {
			n += uint64(k)
			h.Write(buf[:k])
			if _, err := w.Write(buf[:k]); err != nil {
				copyErr = err
				break
			}
			if _, err := pw.Write(buf[:k]); err != nil {
				break // the verifier stopped: its error says why
			}
			if progress != nil {
				progress(n)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			copyErr = rerr
			break
		}
	}
	if copyErr != nil {
		cancel() // stops the verifier too
	}
	pw.Close()
	walkErr := <-walked
	switch {
	case copyErr != nil:
		err = copyErr
	case walkErr != nil:
		err = walkErr
	}
	if err != nil {
		cancel() // aborts the write: nothing is stored
		w.Close()
		return rec, err
	}
	if err := w.Close(); err != nil {
		return rec, err
	}
	rec.size, rec.digest = n, "sha256:"+hex.EncodeToString(h.Sum(nil))
	if attrs, err := bucket.Attributes(ctx, rec.staged); err != nil || uint64(attrs.Size) != n {
		deleteBlob(ctx, bucket, rec.staged)
		return rec, fmt.Errorf("the blob store kept %v of %d bytes: %w", attrs, n, err)
	}
	return rec, nil
}

// commit makes a staged artifact the Transfer's: copied to its final key,
// checked there, and the staging blob deleted.
func commit(ctx context.Context, bucket *blob.Bucket, id string, rec received) error {
	key := artifactKey(id)
	if err := bucket.Copy(ctx, key, rec.staged, nil); err != nil {
		return err
	}
	attrs, err := bucket.Attributes(ctx, key)
	if err != nil {
		return err
	}
	if uint64(attrs.Size) != rec.size {
		deleteBlob(ctx, bucket, key)
		return fmt.Errorf("the blob store kept %d of %d bytes of %s", attrs.Size, rec.size, key)
	}
	return deleteBlob(ctx, bucket, rec.staged)
}

// deleteBlob deletes a blob; a missing one is fine.
func deleteBlob(ctx context.Context, bucket *blob.Bucket, key string) error {
	err := bucket.Delete(ctx, key)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil
	}
	return err
}

// transferOfKey returns the Transfer ID a blob key belongs to and whether
// it is a staging blob; ok is false for a key of neither kind.
func transferOfKey(key string) (id string, staging, ok bool) {
	if rest, found := strings.CutPrefix(key, stagingPrefix); found {
		// <id>.<random>, or <id>/<random> as earlier versions named them.
		i := strings.IndexAny(rest, "./")
		return rest[:max(i, 0)], true, i > 0
	}
	// A name with a dot is no Transfer's: the file blob store writes a
	// copy under <id>.<random>.tmp before it renames it to <id>, and a
	// collection that took it for a Transfer's deleted it mid-copy.
	if id, found := strings.CutPrefix(key, artifactPrefix); found && id != "" && !strings.ContainsAny(id, "/.") {
		return id, false, true
	}
	return "", false, false
}
