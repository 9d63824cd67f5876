package agent

import (
	"context"
	"io"

	"connectrpc.com/connect"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// deliver makes the template's layers locally usable, fetching missing
// blobs from ctrl, and reports progress, which the host's delivery bytes
// count.
func (a *Agent) deliver(ctx context.Context, as *hostv1.Assignment, progress func(done, total uint64)) ([]string, error) {
	img := imagestore.Image{ManifestDigest: as.Template.ImageDigest}
	for _, l := range as.Template.Layers {
		img.Layers = append(img.Layers, imagestore.Layer{Digest: l.Digest, DiffID: l.DiffId, Size: int64(l.SizeBytes)})
		if !a.cfg.Template.HasBlob(l.Digest) {
			if err := a.fetchBlob(ctx, l.Digest); err != nil {
				return nil, err
			}
		}
	}
	var counted uint64 // Unpack reports one call at a time, done growing
	return a.cfg.Template.Unpack(ctx, img, func(done, total uint64) {
		a.counters.deliveredBytes.Add(done - counted)
		counted = done
		progress(done, total)
	})
}

func (a *Agent) fetchBlob(ctx context.Context, digest string) error {
	stream, err := a.cfg.Client.GetTemplateBlob(ctx, connect.NewRequest(&hostv1.GetTemplateBlobRequest{HostId: a.cfg.HostID, Digest: digest}))
	if err != nil {
		return err
	}
	defer stream.Close()
	pr, pw := io.Pipe()
	go func() {
		for stream.Receive() {
			if _, err := pw.Write(stream.Msg().Data); err != nil {
				return
			}
		}
		pw.CloseWithError(stream.Err())
	}()
	err = a.cfg.Template.PutBlob(digest, pr)
	pr.CloseWithError(err)
	return err
}
