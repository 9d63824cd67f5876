package agent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/artifact"
	"github.com/kibotos/kibotos/internal/host/diskimage"
)

// This file is the host's side of transfers: exports ctrl assigns (read
// the stopped workspace's layer and Volume, each mounted read-only, into
// an artifact streamed to ctrl) and restores (make a new workspace's
// layer and Volume from an artifact streamed from ctrl). Nothing is held
// in memory but one chunk at a time.

// Timings of transfers.
const (
	// transferChunk is the size of one message of artifact data.
	transferChunk = 1 << 20
	// transferProgressEvery bounds how often progress is reported.
	transferProgressEvery = 500 * time.Millisecond
	// exportRetry is the first wait before an export that failed is
	// tried again; it doubles up to a minute.
	exportRetry = time.Second
)

// exports runs the exports ctrl assigns, one goroutine each.
type exports struct {
	agent   *Agent
	mu      sync.Mutex
	running map[string]context.CancelFunc
	wg      sync.WaitGroup
}

func newExports(a *Agent) *exports {
	return &exports{agent: a, running: map[string]context.CancelFunc{}}
}

// set starts the exports newly assigned and cancels those no longer are.
func (x *exports) set(ctx context.Context, assignments []*hostv1.TransferAssignment) {
	x.mu.Lock()
	defer x.mu.Unlock()
	assigned := map[string]bool{}
	for _, as := range assignments {
		assigned[as.TransferId] = true
		if _, ok := x.running[as.TransferId]; ok {
			continue
		}
		jctx, cancel := context.WithCancel(ctx)
		x.running[as.TransferId] = cancel
		x.wg.Go(func() { x.run(jctx, as) })
	}
	for id, cancel := range x.running {
		if !assigned[id] {
			cancel()
			delete(x.running, id)
		}
	}
}

// run exports until it succeeds or ctrl no longer wants it.
func (x *exports) run(ctx context.Context, as *hostv1.TransferAssignment) {
	for wait := exportRetry; ; wait = min(2*wait, time.Minute) {
		err := x.agent.export(ctx, as)
		if err == nil || ctx.Err() != nil {
			return
		}
		permanent := errors.Is(err, errGone)
		slog.Warn("export failed; trying again unless ctrl withdraws it", "transfer", as.TransferId, "in", wait, "permanent", permanent, "err", err)
		x.agent.reportTransfer(&hostv1.TransferReport{TransferId: as.TransferId, FailureMessage: x.agent.publicMessage(err), Permanent: permanent})
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// errGone marks an export's failure that trying again cannot help: an
// image it reads is not on the host.
var errGone = errors.New("not on this host")

// gone wraps the error of an image that does not exist with errGone.
func gone(what, path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s %s is %w", what, path, errGone)
	}
	return nil
}

// export reads the workspace's layer and Volume (and, when asked, the
// Template revision's image, fetched from ctrl) into an artifact that it
// uploads to ctrl, holding the layer's lock (no execution starts
// meanwhile) and the Volume's.
func (a *Agent) export(ctx context.Context, as *hostv1.TransferAssignment) (err error) {
	lock := a.layerLock(as.LayerId)
	lock.Lock()
	defer lock.Unlock()
	if err := gone("the writable layer image", a.layerPath(as.LayerId)); err != nil {
		return err
	}
	layouts := map[string]json.RawMessage{}
	if err := addLayout(layouts, artifact.Layer, a.layerPath(as.LayerId)); err != nil {
		return err
	}
	layerDir, unmountLayer, err := diskimage.Mount(a.layerPath(as.LayerId), a.cfg.LayerDir, true)
	if err != nil {
		return fmt.Errorf("mounting the writable layer: %w", err)
	}
	defer releaseMount("the writable layer", unmountLayer)
	var volumeDir string
	if v := as.Volume; v != nil {
		vlock := a.vols.lock(v.VolumeId)
		vlock.Lock()
		defer vlock.Unlock()
		image, err := a.vols.path(v.StoragePool, v.VolumeId)
		if err != nil {
			return err
		}
		if err := gone("the image of volume "+v.VolumeId, image); err != nil {
			return err
		}
		if err := addLayout(layouts, artifact.Volume, image); err != nil {
			return err
		}
		dir, unmountVolume, err := diskimage.Mount(image, filepath.Dir(image), true)
		if err != nil {
			return fmt.Errorf("mounting volume %s: %w", v.VolumeId, err)
		}
		defer releaseMount("volume "+v.VolumeId, unmountVolume)
		volumeDir = dir
	}
	total := usedBytes(layerDir) + usedBytes(volumeDir)

	streamCtx, cancelStream := context.WithCancel(ctx)
	stream := a.cfg.Client.PutTransferArtifact(streamCtx)
	defer func() {
		if err != nil && !errors.Is(err, io.EOF) {
			// An upload that ends on a failure here is aborted, so that ctrl
			// does not take the bytes so far for the whole artifact.
			cancelStream()
		}
		// ctrl's answer: its verdict on the artifact, or, when it ended
		// the upload (a send failed with EOF), why.
		if _, rerr := stream.CloseAndReceive(); rerr != nil && (err == nil || errors.Is(err, io.EOF)) {
			err = rerr
		}
		cancelStream()
	}()
	if err := stream.Send(&hostv1.PutTransferArtifactRequest{HostId: a.cfg.HostID, TransferId: as.TransferId}); err != nil {
		return err
	}
	h := sha256.New()
	out := bufio.NewWriterSize(io.MultiWriter(h, sendWriter(func(p []byte) error {
		return stream.Send(&hostv1.PutTransferArtifactRequest{Data: p})
	})), transferChunk)
	report := a.progressReporter(as.TransferId, total)
	manifest, err := artifact.WithFilesystems(as.Manifest, layouts)
	if err != nil {
		return err
	}
	w, err := artifact.NewWriter(out, manifest, func(read int64) { report(uint64(read)) })
	if err != nil {
		return err
	}
	upper := filepath.Join(layerDir, "upper")
	if _, err := os.Stat(upper); err == nil {
		if err := w.AddTree(ctx, artifact.Layer, upper); err != nil {
			return err
		}
	}
	if volumeDir != "" {
		if err := w.AddTree(ctx, artifact.Volume, volumeDir); err != nil {
			return err
		}
	}
	if len(as.TemplateBlobs) > 0 {
		if err := w.AddTemplate(as.TemplateBlobs, a.templateBlob(ctx)); err != nil {
			return fmt.Errorf("carrying the template: %w", err)
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := out.Flush(); err != nil {
		return err
	}
	if err := stream.Send(&hostv1.PutTransferArtifactRequest{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil))}); err != nil {
		return err
	}
	return nil // the deferred CloseAndReceive takes ctrl's answer
}

// addLayout records the geometry of the image's filesystem as the
// section's layout (artifact.WithFilesystems).
func addLayout(layouts map[string]json.RawMessage, section, image string) error {
	g, err := diskimage.ReadGeometry(image)
	if err != nil {
		return err
	}
	b, err := json.Marshal(g)
	layouts[section] = b
	return err
}

// templateBlob opens a blob of a Template revision's image from ctrl.
func (a *Agent) templateBlob(ctx context.Context) artifact.OpenBlob {
	return func(digest string) (io.ReadCloser, int64, error) {
		stream, err := a.cfg.Client.GetTemplateBlob(ctx, connect.NewRequest(&hostv1.GetTemplateBlobRequest{HostId: a.cfg.HostID, Digest: digest}))
		if err != nil {
			return nil, 0, err
		}
		if !stream.Receive() {
			err := stream.Err()
			stream.Close()
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return nil, 0, err
		}
		first := stream.Msg()
		src := &streamReader{pending: first.Data, next: func() ([]byte, error) {
			if stream.Receive() {
				return stream.Msg().Data, nil
			}
			if err := stream.Err(); err != nil {
				return nil, err
			}
			return nil, io.EOF
		}}
		return readCloser{Reader: src, close: stream.Close}, int64(first.TotalBytes), nil
	}
}

// readCloser closes what it reads with close.
type readCloser struct {
	io.Reader
	close func() error
}

func (r readCloser) Close() error { return r.close() }

// sendWriter is an io.Writer that sends each write as one message.
type sendWriter func([]byte) error

func (s sendWriter) Write(p []byte) (int, error) {
	if err := s(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// usedBytes is what a mounted filesystem uses; zero for "".
func usedBytes(dir string) uint64 {
	if dir == "" {
		return 0
	}
	used, _, err := diskimage.Usage(dir)
	if err != nil {
		return 0
	}
	return used
}

// progressReporter returns a function that reports a transfer's progress
// at most every transferProgressEvery.
func (a *Agent) progressReporter(transferID string, total uint64) func(done uint64) {
	var last time.Time
	return func(done uint64) {
		if time.Since(last) < transferProgressEvery {
			return
		}
		last = time.Now()
		a.reportTransfer(&hostv1.TransferReport{TransferId: transferID, BytesDone: done, BytesTotal: max(total, done)})
	}
}

// reportTransfer queues a transfer's progress for ctrl.
func (a *Agent) reportTransfer(r *hostv1.TransferReport) {
	r.ObservedAt = timestamppb.Now()
	select {
	case a.transferReports <- r:
	default: // the next one carries it
	}
}

// restore makes a restored workspace's missing writable layer and Volume
// from its Transfer's artifact, in one pass over the artifact: each image
// is built under a temporary name and renamed into place once the whole
// artifact verified (artifact.Extract, and its digest). The layer's lock
// is held.
func (e *execution) restore(ctx context.Context, as *hostv1.Assignment) error {
	a := e.agent
	roots := map[string]string{}
	type image struct {
		section, path string
		bytes         uint64
		uuid          string
	}
	var images []image
	layer := a.layerPath(as.LayerId)
	if _, err := os.Stat(layer); errors.Is(err, os.ErrNotExist) {
		images = append(images, image{artifact.Layer, layer, as.Resources.GetWritableLayerBytes(), ""})
	}
	if v := as.Volume; v != nil {
		vlock := a.vols.lock(v.VolumeId)
		vlock.Lock()
		defer vlock.Unlock()
		va := a.vols.assignment(v.VolumeId)
		path, err := a.vols.path(v.StoragePool, v.VolumeId)
		if err != nil {
			return err
		}
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			if va == nil || !va.Restoring {
				return fmt.Errorf("volume %s is not assigned to be restored here", v.VolumeId)
			}
			images = append(images, image{artifact.Volume, path, va.CapacityBytes, va.FilesystemUuid})
		}
	}
	if len(images) == 0 {
		return nil // restored before a crash or a retry
	}
	layouts, err := a.artifactLayouts(ctx, as.Restore.TransferId)
	if err != nil {
		return fmt.Errorf("restoring from transfer %s: %w", as.Restore.TransferId, err)
	}
	var fill func(i int) error
	fill = func(i int) error {
		if i == len(images) {
			return a.extract(ctx, as.Restore, roots)
		}
		im := images[i]
		return diskimage.CreateFilled(ctx, im.path, im.bytes, im.uuid, layouts[im.section], func(dir string) error {
			root := dir
			if im.section == artifact.Layer {
				root = filepath.Join(dir, "upper")
				if err := os.Mkdir(root, 0o755); err != nil {
					return err
				}
			}
			roots[im.section] = root
			return fill(i + 1)
		})
	}
	if err := fill(0); err != nil {
		err = fmt.Errorf("restoring from transfer %s: %w", as.Restore.TransferId, err)
		if v := as.Volume; v != nil && slices.ContainsFunc(images, func(im image) bool { return im.section == artifact.Volume }) {
			// The Volume was never made: its creation failed with the
			// restore, which is not tried again (the Transfer fails).
			a.vols.report(&hostv1.VolumeReport{VolumeId: v.VolumeId,
				FailureStage: ctrlv1.FailureStage_FAILURE_STAGE_CREATING_VOLUME, FailureMessage: a.publicMessage(err)})
		}
		return err
	}
	return nil
}

// artifactLayouts reads the start of the transfer's artifact from ctrl
// for the geometries of the filesystems its sections were read from, by
// section; an artifact that records none gives none.
func (a *Agent) artifactLayouts(ctx context.Context, transferID string) (map[string]*diskimage.Geometry, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the rest of the artifact is not read
	src, closeStream, err := a.openArtifact(ctx, transferID, nil)
	if err != nil {
		return nil, err
	}
	defer closeStream()
	raw, err := artifact.Filesystems(src)
	if err != nil {
		return nil, err
	}
	layouts := map[string]*diskimage.Geometry{}
	for section, b := range raw {
		g := new(diskimage.Geometry)
		if err := json.Unmarshal(b, g); err != nil {
			return nil, fmt.Errorf("%w: the layout of its %s: %v", artifact.ErrInvalid, section, err)
		}
		layouts[section] = g
	}
	return layouts, nil
}

// openArtifact streams the transfer's artifact from ctrl; got, when not
// nil, is told the bytes read so far.
func (a *Agent) openArtifact(ctx context.Context, transferID string, got func(n uint64)) (io.Reader, func() error, error) {
	stream, err := a.cfg.Client.GetTransferArtifact(ctx, connect.NewRequest(&hostv1.GetTransferArtifactRequest{HostId: a.cfg.HostID, TransferId: transferID}))
	if err != nil {
		return nil, nil, err
	}
	var n uint64
	return &streamReader{next: func() ([]byte, error) {
		if stream.Receive() {
			n += uint64(len(stream.Msg().Data))
			if got != nil {
				got(n)
			}
			return stream.Msg().Data, nil
		}
		if err := stream.Err(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}}, stream.Close, nil
}

// extract streams the artifact from ctrl into roots and checks its digest.
func (a *Agent) extract(ctx context.Context, r *hostv1.ExecutionRestore, roots map[string]string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	report := a.progressReporter(r.TransferId, r.SizeBytes)
	var n uint64
	src, closeStream, err := a.openArtifact(ctx, r.TransferId, func(read uint64) { n = read; report(read) })
	if err != nil {
		return err
	}
	defer closeStream()
	h := sha256.New()
	if _, err := artifact.Extract(ctx, io.TeeReader(src, h), roots); err != nil {
		return err
	}
	if _, err := io.Copy(h, src); err != nil {
		return err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != r.Digest || n != r.SizeBytes {
		return fmt.Errorf("the artifact read is %s of %d bytes, not the transfer's %s of %d bytes", got, n, r.Digest, r.SizeBytes)
	}
	return nil
}

// streamReader reads the data of a server stream's messages.
type streamReader struct {
	pending []byte
	next    func() ([]byte, error)
}

func (s *streamReader) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		data, err := s.next()
		if err != nil {
			return 0, err
		}
		s.pending = data
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

// releaseMount unmounts what an export mounted, saying so when it cannot:
// the image stays in use, and the next export or start of it fails.
func releaseMount(what string, unmount func() error) {
	if err := unmount(); err != nil {
		slog.Error("export: releasing the mount of "+what, "err", err)
	}
}
