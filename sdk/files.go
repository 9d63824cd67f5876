package sdk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/sdk/chunked"
)

// ChunkSize is the size of the chunks Upload sends.
const ChunkSize = chunked.Size

// FileOption adjusts a file call.
type FileOption func(*fileOptions)

type fileOptions struct {
	user     string
	progress func(int64)
	info     func(*datav1.FileInfo)
	merge    bool
}

func collect(opts []FileOption) fileOptions {
	var o fileOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// AsUser makes the call as this user of the guest; the default is root.
func AsUser(name string) FileOption {
	return func(o *fileOptions) { o.user = name }
}

// WithProgress makes Upload and Download call fn with the number of bytes
// moved so far, after each chunk.
func WithProgress(fn func(done int64)) FileOption {
	return func(o *fileOptions) { o.progress = fn }
}

// WithFileInfo makes Download call fn, before it writes any byte, with
// the metadata of the file it reads: a symlink's target's for a symlink.
// A guest agent too old to send it does not call fn.
func WithFileInfo(fn func(*datav1.FileInfo)) FileOption {
	return func(o *fileOptions) { o.info = fn }
}

// MergeDirectories makes Move of a directory onto an existing directory
// move its entries into it, merging directories of the same name and
// replacing other entries, each by a rename: a move cut short leaves each
// entry whole, at its source or its destination. Without it, such a move
// fails already_exists.
func MergeDirectories() FileOption {
	return func(o *fileOptions) { o.merge = true }
}

// Upload writes the bytes of r to remotePath, as the body of a PUT of
// FileBytesPath (to a data plane without it, in chunks of ChunkSize through
// FileService.WriteFile). The guest writes a temporary file and renames
// it into place only once the whole body arrived, so a failed or abandoned
// upload leaves an existing file intact. When r tells its length (a
// bytes.Reader, a strings.Reader, a bytes.Buffer), the guest also checks
// it received exactly that many bytes. mode's permission bits
// apply to a new file; 0 is 0644. An error reading r abandons the upload.
// An upload refused for its session is sent again with a new one once: r
// from where it started when it can seek back, else from what was read of
// it, held up to 8 MiB (r is read once; past that, the refusal is the
// caller's).
func (w *Workspace) Upload(ctx context.Context, r io.Reader, remotePath string, mode fs.FileMode, opts ...FileOption) (*datav1.FileInfo, error) {
	o := collect(opts)
	start := &datav1.WriteFileStart{Path: remotePath, User: o.user, Mode: uint32(mode.Perm())}
	seeker, _ := r.(io.Seeker)
	var origin int64
	if seeker != nil {
		var err error
		if origin, err = seeker.Seek(0, io.SeekCurrent); err != nil {
			seeker = nil
		}
	}
	var stream *rereader
	if _, sized := r.(interface{ Len() int }); seeker == nil && !sized { // a sized one tells the guest its length
		stream = newRereader(r, rereadBytes)
	}
	progress := rising(o.progress)
	for retried := false; ; retried = true {
		d, err := w.dataPlane(ctx)
		if err != nil {
			return nil, err
		}
		src := r
		if stream != nil {
			src = stream.next()
		}
		var info *datav1.FileInfo
		var read int64
		served, err := w.c.servesFileBytes(ctx, d)
		switch {
		case err != nil:
		case served:
			info, read, err = w.c.uploadBytes(ctx, d, src, start, progress)
		default:
			info, read, err = upload(ctx, d, src, start, progress)
		}
		if err == nil {
			return info, nil
		}
		if !w.dropRefused(d, err) || retried {
			return nil, err
		}
		if stream == nil && read > 0 && !rewind(seeker, origin) {
			return nil, err
		}
		if stream != nil {
			switch rerr := stream.restart(ctx); {
			case errors.Is(rerr, errNotHeld):
				return nil, err
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case rerr != nil:
				return nil, fmt.Errorf("reading the upload: %w", rerr)
			}
		}
	}
}

// rising calls report only with counts above the highest so far: an
// attempt sent again counts from 0.
func rising(report func(int64)) func(int64) {
	if report == nil {
		return nil
	}
	var highest int64
	return func(sent int64) {
		if sent > highest {
			highest = sent
			report(sent)
		}
	}
}

// rewind seeks seeker, when there is one, back to origin, and reports
// whether it did.
func rewind(seeker io.Seeker, origin int64) bool {
	if seeker == nil {
		return false
	}
	_, err := seeker.Seek(origin, io.SeekStart)
	return err == nil
}

// upload is one WriteFile call. read counts the bytes read from r, sent or
// not.
func upload(ctx context.Context, d *dataPlane, r io.Reader, start *datav1.WriteFileStart, progress func(int64)) (_ *datav1.FileInfo, read int64, _ error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // after a read error, abandons the call: without commit nothing is written
	if l, ok := r.(interface{ Len() int }); ok {
		size := uint64(l.Len())
		start = &datav1.WriteFileStart{Path: start.Path, User: start.User, Mode: start.Mode, Size: &size}
	}
	stream := d.files.WriteFile(ctx)
	err := stream.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Start{Start: start}})
	if err == nil {
		var rerr error
		var sent int64
		read, rerr, err = chunked.Send(r, ChunkSize, func(chunk []byte) error {
			// Send marshals the message before it returns, so chunk can be reused.
			if err := stream.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Data{Data: chunk}}); err != nil {
				return err
			}
			sent += int64(len(chunk))
			if progress != nil {
				progress(sent)
			}
			return nil
		})
		if rerr != nil {
			return nil, read, fmt.Errorf("reading the upload: %w", rerr)
		}
	}
	if err == nil {
		err = stream.Send(&datav1.WriteFileRequest{Part: &datav1.WriteFileRequest_Commit{Commit: true}})
	}
	resp, err := chunked.Receive(stream, err)
	if err != nil {
		return nil, read, err
	}
	return resp.GetFile(), read, nil
}

// Download writes the bytes of remotePath to dst in order and returns how
// many it wrote. They come as the body of a GET of FileBytesPath (from a
// data plane without it, through FileService.ReadFile).
func (w *Workspace) Download(ctx context.Context, remotePath string, dst io.Writer, opts ...FileOption) (int64, error) {
	o := collect(opts)
	for retried := false; ; retried = true {
		d, err := w.dataPlane(ctx)
		if err != nil {
			return 0, err
		}
		if d.fileBytes.Load() == fileBytesNotServed {
			return w.downloadMessages(ctx, remotePath, dst, o)
		}
		n, err := w.c.downloadBytes(ctx, d, remotePath, dst, o)
		if errors.Is(err, errNoFileBytes) {
			return w.downloadMessages(ctx, remotePath, dst, o)
		}
		if err == nil || !w.dropRefused(d, err) || n > 0 || retried {
			return n, err
		}
	}
}

// downloadMessages is Download through FileService.ReadFile, for a data
// plane without FileBytesPath.
func (w *Workspace) downloadMessages(ctx context.Context, remotePath string, dst io.Writer, o fileOptions) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, ok, err := serverStream(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.ReadFileRequest]) (*connect.ServerStreamForClient[datav1.ReadFileResponse], error) {
		return d.files.ReadFile
	}, &datav1.ReadFileRequest{Path: remotePath, User: o.user})
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	var n int64
	for ; ok; ok = stream.Receive() {
		if f := stream.Msg().GetFile(); f != nil && o.info != nil {
			o.info(f)
		}
		m, err := dst.Write(stream.Msg().GetData())
		n += int64(m)
		if err != nil {
			return n, err
		}
		if o.progress != nil {
			o.progress(n)
		}
	}
	return n, stream.Err()
}

// ReadFile returns the contents of remotePath.
func (w *Workspace) ReadFile(ctx context.Context, remotePath string, opts ...FileOption) ([]byte, error) {
	var b bytes.Buffer
	if _, err := w.Download(ctx, remotePath, &b, opts...); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteFile writes data to remotePath as Upload does.
func (w *Workspace) WriteFile(ctx context.Context, remotePath string, data []byte, mode fs.FileMode, opts ...FileOption) error {
	_, err := w.Upload(ctx, bytes.NewReader(data), remotePath, mode, opts...)
	return err
}

// Stat returns the metadata of remotePath, without following a final
// symlink.
func (w *Workspace) Stat(ctx context.Context, remotePath string, opts ...FileOption) (*datav1.FileInfo, error) {
	o := collect(opts)
	resp, err := unary(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.InspectFileRequest]) (*connect.Response[datav1.InspectFileResponse], error) {
		return d.files.InspectFile
	}, &datav1.InspectFileRequest{Path: remotePath, User: o.user})
	return resp.GetFile(), err
}

// List returns the entries of the directory remotePath, descending depth
// levels (0 and 1 list the directory only), depth-first in name order.
func (w *Workspace) List(ctx context.Context, remotePath string, depth int, opts ...FileOption) ([]*datav1.FileInfo, error) {
	o := collect(opts)
	resp, err := unary(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.ListDirectoryRequest]) (*connect.Response[datav1.ListDirectoryResponse], error) {
		return d.files.ListDirectory
	}, &datav1.ListDirectoryRequest{Path: remotePath, User: o.user, Depth: uint32(max(depth, 0))})
	return resp.GetEntries(), err
}

// Mkdir creates the directory remotePath; its parent must exist. mode's
// permission bits, and its setuid, setgid and sticky bits, apply exactly;
// 0 is 0755.
func (w *Workspace) Mkdir(ctx context.Context, remotePath string, mode fs.FileMode, opts ...FileOption) error {
	return w.mkdir(ctx, remotePath, mode, false, opts)
}

// MkdirAll creates the directory remotePath and any missing parents.
func (w *Workspace) MkdirAll(ctx context.Context, remotePath string, mode fs.FileMode, opts ...FileOption) error {
	return w.mkdir(ctx, remotePath, mode, true, opts)
}

func (w *Workspace) mkdir(ctx context.Context, path string, mode fs.FileMode, parents bool, opts []FileOption) error {
	o := collect(opts)
	_, err := unary(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.CreateDirectoryRequest]) (*connect.Response[datav1.CreateDirectoryResponse], error) {
		return d.files.CreateDirectory
	}, &datav1.CreateDirectoryRequest{Path: path, User: o.user, Parents: parents, Mode: UnixMode(mode)})
	return err
}

// UnixMode is mode as the data plane carries it (and chmod takes it): the
// permission bits, with the setuid, setgid and sticky bits.
func UnixMode(mode fs.FileMode) uint32 {
	m := uint32(mode.Perm())
	if mode&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if mode&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if mode&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	return m
}

// Remove deletes a file or an empty directory.
func (w *Workspace) Remove(ctx context.Context, remotePath string, opts ...FileOption) error {
	return w.remove(ctx, remotePath, false, opts)
}

// RemoveAll deletes a file, or a directory and everything in it.
func (w *Workspace) RemoveAll(ctx context.Context, remotePath string, opts ...FileOption) error {
	return w.remove(ctx, remotePath, true, opts)
}

func (w *Workspace) remove(ctx context.Context, path string, recursive bool, opts []FileOption) error {
	o := collect(opts)
	_, err := unary(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.DeleteFileRequest]) (*connect.Response[datav1.DeleteFileResponse], error) {
		return d.files.DeleteFile
	}, &datav1.DeleteFileRequest{Path: path, User: o.user, Recursive: recursive})
	return err
}

// Move renames a file or directory; see MergeDirectories.
func (w *Workspace) Move(ctx context.Context, src, dst string, opts ...FileOption) error {
	o := collect(opts)
	_, err := unary(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.MoveFileRequest]) (*connect.Response[datav1.MoveFileResponse], error) {
		return d.files.MoveFile
	}, &datav1.MoveFileRequest{Source: src, Destination: dst, User: o.user, Merge: o.merge})
	return err
}

// Watch yields the changes under the directory remotePath in the order
// they happen, recursively when asked, until ctx ends or the loop breaks.
// An error ends the sequence as its last element.
func (w *Workspace) Watch(ctx context.Context, remotePath string, recursive bool, opts ...FileOption) iter.Seq2[*datav1.WatchDirectoryResponse, error] {
	o := collect(opts)
	req := &datav1.WatchDirectoryRequest{Path: remotePath, User: o.user, Recursive: recursive}
	return func(yield func(*datav1.WatchDirectoryResponse, error) bool) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, ok, err := serverStream(ctx, w, func(d *dataPlane) func(context.Context, *connect.Request[datav1.WatchDirectoryRequest]) (*connect.ServerStreamForClient[datav1.WatchDirectoryResponse], error) {
			return d.files.WatchDirectory
		}, req)
		if err != nil {
			yield(nil, err)
			return
		}
		defer stream.Close()
		for ; ok; ok = stream.Receive() {
			if !yield(stream.Msg(), nil) {
				return
			}
		}
		if err := stream.Err(); err != nil {
			yield(nil, err)
		}
	}
}
