package dataplane

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/treemove"
)

const (
	// readChunk is the size of one ReadFile message: large, so that a
	// file's bytes cost few messages, reads and writes on their way.
	readChunk = 1 << 20
	// maxListEntries bounds one ListDirectory answer, and maxListBytes its
	// size: well below the 64 MiB the SDKs read of one message, since
	// 100,000 entries of long names or symlink targets may be 400 MB.
	maxListEntries = 100_000
	maxListBytes   = 48 << 20
)

// FileConfig configures a FileService.
type FileConfig struct {
	// Accounts resolves user names; nil reads /etc/passwd and /etc/group.
	Accounts *Accounts
	// Logf, if set, receives diagnostics.
	Logf func(format string, args ...any)
}

// FileService implements kibotos.data.v1.FileService. Every operation
// runs with the filesystem credentials of the request's user (asUser), so
// the kernel checks permissions as for that user; the empty user is root.
// A relative path is relative to the user's home directory.
type FileService struct {
	datav1connect.UnimplementedFileServiceHandler

	accounts *Accounts
	logf     func(format string, args ...any)

	closeOnce sync.Once
	closed    chan struct{} // closed by Close: watches end
}

// NewFileService returns a FileService.
func NewFileService(cfg FileConfig) *FileService {
	s := &FileService{accounts: cmp.Or(cfg.Accounts, &Accounts{}), logf: cfg.Logf, closed: make(chan struct{})}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	return s
}

// Close ends every WatchDirectory stream; other calls are unaffected.
func (s *FileService) Close() {
	s.closeOnce.Do(func() { close(s.closed) })
}

// resolve looks up the user and makes path absolute and clean.
func (s *FileService) resolve(user, path string, stage stageT) (*User, string, error) {
	u, err := s.accounts.Lookup(user)
	if errors.Is(err, errUnknownUser) {
		return nil, "", newError(connect.CodeInvalidArgument, stage, "user: %v", err)
	} else if err != nil {
		return nil, "", toConnect(stage, err)
	}
	p, err := cleanPath(u, path, stage)
	return u, p, err
}

// cleanPath makes path absolute (relative to u's home) and clean.
func cleanPath(u *User, path string, stage stageT) (string, error) {
	if path == "" {
		return "", newError(connect.CodeInvalidArgument, stage, "path is required")
	}
	if strings.IndexByte(path, 0) >= 0 {
		return "", newError(connect.CodeInvalidArgument, stage, "path contains a NUL byte")
	}
	if !utf8.ValidString(path) {
		return "", newError(connect.CodeInvalidArgument, stage,
			"path %q is not UTF-8 text, which is all the API carries: reach such a file through a process (ws exec)", path)
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(u.Home, path)
	}
	return filepath.Clean(path), nil
}

// ReadFile implements FileService.ReadFile: the file's bytes in messages
// of up to 1 MiB, read as they are sent, the first with the file's
// metadata. A final symlink is followed: the bytes and the metadata are
// those of the file it leads to.
func (s *FileService) ReadFile(ctx context.Context, req *connect.Request[datav1.ReadFileRequest], stream *connect.ServerStream[datav1.ReadFileResponse]) error {
	f, info, err := s.openToRead(req.Msg.GetUser(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	defer f.Close()
	next := &datav1.ReadFileResponse{File: info}
	buf := make([]byte, readChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 || (err == io.EOF && next.File != nil) {
			next.Data = buf[:n]
			if serr := stream.Send(next); serr != nil {
				return toConnect(stageReadingFile, serr)
			}
			next = &datav1.ReadFileResponse{}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return toConnect(stageReadingFile, err)
		}
		if ctx.Err() != nil {
			return toConnect(stageReadingFile, ctx.Err())
		}
	}
}

// openToRead opens the file at path for reading as user, a final symlink
// followed, and returns it with its metadata: that of the open file, what
// is read, not what path names by now. A directory is refused.
func (s *FileService) openToRead(user, path string) (*os.File, *datav1.FileInfo, error) {
	u, path, err := s.resolve(user, path, stageReadingFile)
	if err != nil {
		return nil, nil, err
	}
	var f *os.File
	err = asUser(u, func() (err error) {
		// O_NONBLOCK: opening a FIFO must not wait for a writer.
		f, err = os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		return err
	})
	if err != nil {
		return nil, nil, toConnect(stageReadingFile, err)
	}
	fi, err := f.Stat()
	if err == nil && fi.IsDir() {
		err = &os.PathError{Op: "read", Path: path, Err: syscall.EISDIR}
	}
	if err != nil {
		f.Close()
		return nil, nil, toConnect(stageReadingFile, err)
	}
	return f, fileInfo(s.accounts.names(), path, fi), nil
}

// WriteFile implements FileService.WriteFile. The data goes to a new
// file beside the target, which is synced and renamed over it once commit
// arrives: a failed or unfinished write leaves the old file as it was. A final symlink is followed, so
// the file it points to is replaced. Replacing a file keeps its mode and
// owner (setuid and setgid are dropped when another user writes it); a
// new file gets start.mode and belongs to the user.
func (s *FileService) WriteFile(ctx context.Context, stream *connect.ClientStream[datav1.WriteFileRequest]) (*connect.Response[datav1.WriteFileResponse], error) {
	start, err := receiveStart(stream)
	if err != nil {
		return nil, err
	}
	info, err := s.replaceFile(ctx, start.GetUser(), start.GetPath(), start.GetMode(), func(f *os.File) error {
		return receiveData(stream, start, f)
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&datav1.WriteFileResponse{File: info}), nil
}

// replaceFile writes the file at path as user: receive fills a new file
// beside it, which is given its mode (a new file's is mode, 0 meaning
// 0644), synced and renamed over the target only once receive has
// succeeded and ctx is still live. Anything less leaves the old file as it
// was. It returns the metadata of the file written.
func (s *FileService) replaceFile(ctx context.Context, user, path string, mode uint32, receive func(*os.File) error) (*datav1.FileInfo, error) {
	u, path, err := s.resolve(user, path, stageWritingFile)
	if err != nil {
		return nil, err
	}
	var rep *replacement
	if err := asUser(u, func() (err error) { rep, err = newReplacement(path); return err }); err != nil {
		return nil, toConnect(stageWritingFile, err)
	}
	if err := receive(rep.tmp); err != nil {
		rep.discard()
		return nil, toConnect(stageWritingFile, err)
	}
	if err := ctx.Err(); err != nil {
		rep.discard()
		return nil, toConnect(stageWritingFile, err)
	}
	if err := rep.finish(u, mode); err != nil {
		rep.discard()
		return nil, toConnect(stageWritingFile, err)
	}
	if err := rep.commit(u); err != nil {
		return nil, toConnect(stageWritingFile, err)
	}
	syncDir(filepath.Dir(rep.target))
	var info *datav1.FileInfo
	err = asUser(u, func() (err error) {
		info, err = inspect(s.accounts.names(), path)
		return err
	})
	if err != nil {
		return nil, toConnect(stageWritingFile, err)
	}
	return info, nil
}

// receiveStart receives and checks WriteFile's first message.
func receiveStart(stream *connect.ClientStream[datav1.WriteFileRequest]) (*datav1.WriteFileStart, error) {
	if !stream.Receive() {
		if err := stream.Err(); err != nil {
			return nil, toConnect(stageWritingFile, err)
		}
		return nil, newError(connect.CodeInvalidArgument, stageWritingFile, "empty stream: the first message must be start")
	}
	start := stream.Msg().GetStart()
	if start == nil {
		return nil, newError(connect.CodeInvalidArgument, stageWritingFile, "the first message must be start")
	}
	if mode := start.GetMode(); mode > 0o7777 {
		return nil, newError(connect.CodeInvalidArgument, stageWritingFile, "mode %#o has bits beyond 07777", mode)
	}
	return start, nil
}

// receiveData writes the data of WriteFile's further messages to f until
// commit, which must be the last message and, when start.size is set, come
// after exactly that many bytes. A stream that ends without commit was cut
// short: aborted, so nothing is written.
func receiveData(stream *connect.ClientStream[datav1.WriteFileRequest], start *datav1.WriteFileStart, f *os.File) error {
	var received uint64
	for stream.Receive() {
		switch part := stream.Msg().GetPart().(type) {
		case *datav1.WriteFileRequest_Start:
			return newError(connect.CodeInvalidArgument, stageWritingFile, "start sent twice")
		case *datav1.WriteFileRequest_Commit:
			if !part.Commit {
				return newError(connect.CodeInvalidArgument, stageWritingFile, "commit must be true")
			}
			if start.Size != nil && received != start.GetSize() {
				return newError(connect.CodeInvalidArgument, stageWritingFile, "received %d bytes, start declared size %d", received, start.GetSize())
			}
			if stream.Receive() {
				return newError(connect.CodeInvalidArgument, stageWritingFile, "a message after commit")
			}
			return stream.Err()
		default:
			data := stream.Msg().GetData()
			received += uint64(len(data))
			if start.Size != nil && received > start.GetSize() {
				return newError(connect.CodeInvalidArgument, stageWritingFile, "more than the %d bytes start declared", start.GetSize())
			}
			if _, err := f.Write(data); err != nil {
				return err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	return newError(connect.CodeAborted, stageWritingFile, "the stream ended without commit after %d bytes: nothing was written", received)
}

// replacement is a file being written: a new file beside the target,
// renamed over it once complete. The new file is unnamed (O_TMPFILE)
// where the filesystem can make one, so that a write cut short by a
// forced stop or a crash leaves nothing behind; it is given a name of
// its own (tempName) only for the rename.
type replacement struct {
	target string      // the path written, its final symlinks followed
	old    os.FileInfo // the file being replaced; nil for a new one
	tmp    *os.File
	// unnamed is set when tmp has no name yet (O_TMPFILE).
	unnamed bool
}

// newReplacement checks that the file at path (a final symlink followed)
// may be replaced, and creates the temporary file. It runs as the user.
func newReplacement(path string) (*replacement, error) {
	target, err := resolveFinalLink(path)
	if err != nil {
		return nil, err
	}
	rep := &replacement{target: target}
	rep.old, err = os.Stat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		rep.old = nil
	case err != nil:
		return nil, err
	case rep.old.IsDir():
		return nil, &os.PathError{Op: "write", Path: target, Err: syscall.EISDIR}
	case !rep.old.Mode().IsRegular():
		return nil, newError(connect.CodeFailedPrecondition, stageWritingFile, "%s is not a regular file", target)
	default:
		// The user must be allowed to write the file itself, not only
		// the directory that the rename changes. ETXTBSY (a running
		// program) comes after the permission check, and the rename
		// replaces a running program fine.
		f, err := os.OpenFile(target, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			f.Close()
		} else if !errors.Is(err, syscall.ETXTBSY) {
			return nil, err
		}
	}
	if rep.tmp, rep.unnamed, err = createTemp(target); err != nil {
		return nil, err
	}
	return rep, nil
}

// commit puts the new file at the target, as root (the user made it in
// that directory, and the rename that follows is the user's), and closes
// it: an unnamed one is linked under a temporary name first.
func (rep *replacement) commit(u *User) error {
	defer rep.tmp.Close()
	from := rep.tmp.Name()
	if rep.unnamed {
		var err error
		if from, err = linkTemp(rep.tmp, filepath.Dir(rep.target)); err != nil {
			return err
		}
	}
	err := asUser(u, func() error { return os.Rename(from, rep.target) })
	if err != nil && rep.unnamed {
		os.Remove(from)
	}
	return err
}

// discard drops the new file of a write that did not commit.
func (rep *replacement) discard() {
	rep.tmp.Close()
	if !rep.unnamed {
		os.Remove(rep.tmp.Name()) // ours: the agent may remove it
	}
}

// finish gives the file written by u its mode and owner, as WriteFile
// says (mode is start.mode), and makes it durable.
func (rep *replacement) finish(u *User, mode uint32) error {
	if rep.old == nil {
		if mode == 0 {
			mode = 0o644
		}
		// As the user, so the kernel drops a setgid bit the user may not set.
		if err := asUser(u, func() error { return rep.tmp.Chmod(unixMode(os.FileMode(mode))) }); err != nil {
			return err
		}
	} else {
		st := rep.old.Sys().(*syscall.Stat_t)
		perm := os.FileMode(st.Mode & 0o7777)
		if st.Uid != u.UID {
			perm &^= 0o6000
		}
		if os.Geteuid() == 0 {
			// Keep the owner, as an in-place write would.
			if err := rep.tmp.Chown(int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
		if err := rep.tmp.Chmod(unixMode(perm)); err != nil {
			return err
		}
	}
	return rep.tmp.Sync()
}

// unixMode converts permission bits with setuid, setgid and sticky to an
// os.FileMode.
func unixMode(m os.FileMode) os.FileMode {
	perm := m & 0o777
	if m&0o4000 != 0 {
		perm |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		perm |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		perm |= os.ModeSticky
	}
	return perm
}

// resolveFinalLink follows path while it is a symlink.
func resolveFinalLink(path string) (string, error) {
	for range 40 {
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			return path, nil // a missing path is written as it is
		}
		dest, err := os.Readlink(path)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(filepath.Dir(path), dest)
		}
		path = filepath.Clean(dest)
	}
	return "", &os.PathError{Op: "write", Path: path, Err: syscall.ELOOP}
}

// tempMark and tempRandBytes make the name of a write's temporary file.
const (
	tempMark      = ".kibotos-"
	tempRandBytes = 6
)

// isTemp reports whether path is named as tempName names a write's
// temporary file (or as an earlier build did: .<target's
// name>.kibotos-<hex>).
func isTemp(path string) bool {
	base := filepath.Base(path)
	i := strings.LastIndex(base, tempMark)
	if i < 0 || base[0] != '.' {
		return false
	}
	suffix := base[i+len(tempMark):]
	_, err := hex.DecodeString(suffix)
	return len(suffix) == 2*tempRandBytes && err == nil
}

// isUnnamed reports whether path is the name inotify gives an unnamed file
// of its directory (O_TMPFILE, as createTemp makes): #<inode>, which no
// file of the directory has.
func isUnnamed(path string) bool {
	digits, ok := strings.CutPrefix(filepath.Base(path), "#")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return false
	}
	_, err := os.Lstat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// tempName returns a new name in dir for a write's temporary file, as
// isTemp knows it: .kibotos-<12 hex digits>, whatever the target's name
// (a name of 255 bytes has no room for more).
func tempName(dir string) string {
	var b [tempRandBytes]byte
	rand.Read(b[:])
	return filepath.Join(dir, tempMark+hex.EncodeToString(b[:]))
}

// createTemp creates a new, empty, private file in target's directory:
// unnamed where the filesystem can (unnamed is then set), else under a
// tempName. Its errors, and those of its writes, name target.
func createTemp(target string) (f *os.File, unnamed bool, err error) {
	dir := filepath.Dir(target)
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), target), true, nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EINVAL) {
		return nil, false, &fs.PathError{Op: "create", Path: target, Err: err}
	}
	for {
		f, err := os.OpenFile(tempName(dir), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			// Named by the file asked for, not by the temporary one.
			return nil, false, &fs.PathError{Op: "create", Path: target, Err: pe.Err}
		}
		return f, false, err
	}
}

// linkTemp gives the unnamed file f a tempName in dir and returns it.
func linkTemp(f *os.File, dir string) (string, error) {
	for {
		name := tempName(dir)
		err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.AT_FDCWD, name, unix.AT_SYMLINK_FOLLOW)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return "", &fs.PathError{Op: "link", Path: f.Name(), Err: err}
		}
		return name, nil
	}
}

// syncDir makes a rename in dir durable, as far as it can.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// DeleteFile implements FileService.DeleteFile.
func (s *FileService) DeleteFile(ctx context.Context, req *connect.Request[datav1.DeleteFileRequest]) (*connect.Response[datav1.DeleteFileResponse], error) {
	u, path, err := s.resolve(req.Msg.GetUser(), req.Msg.GetPath(), stageDeletingFile)
	if err != nil {
		return nil, err
	}
	if path == "/" {
		return nil, newError(connect.CodeInvalidArgument, stageDeletingFile, "will not delete /")
	}
	err = asUser(u, func() error {
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return wrapPath("unlink", path, unix.Unlink(path))
		}
		if req.Msg.GetRecursive() {
			return os.RemoveAll(path)
		}
		return wrapPath("rmdir", path, unix.Rmdir(path))
	})
	if err != nil {
		return nil, toConnect(stageDeletingFile, err)
	}
	return connect.NewResponse(&datav1.DeleteFileResponse{}), nil
}

func wrapPath(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: path, Err: err}
}

// InspectFile implements FileService.InspectFile.
func (s *FileService) InspectFile(ctx context.Context, req *connect.Request[datav1.InspectFileRequest]) (*connect.Response[datav1.InspectFileResponse], error) {
	u, path, err := s.resolve(req.Msg.GetUser(), req.Msg.GetPath(), stageInspectingFile)
	if err != nil {
		return nil, err
	}
	var info *datav1.FileInfo
	err = asUser(u, func() (err error) {
		info, err = inspect(s.accounts.names(), path)
		return err
	})
	if err != nil {
		return nil, toConnect(stageInspectingFile, err)
	}
	return connect.NewResponse(&datav1.InspectFileResponse{File: info}), nil
}

// MoveFile implements FileService.MoveFile with rename(2): a file at the
// destination is replaced; a directory there is already_exists, or with
// merge takes a directory's entries (treemove); moving across filesystems
// is failed_precondition (EXDEV).
func (s *FileService) MoveFile(ctx context.Context, req *connect.Request[datav1.MoveFileRequest]) (*connect.Response[datav1.MoveFileResponse], error) {
	u, src, err := s.resolve(req.Msg.GetUser(), req.Msg.GetSource(), stageMovingFile)
	if err != nil {
		return nil, err
	}
	dst, err := cleanPath(u, req.Msg.GetDestination(), stageMovingFile)
	if err != nil {
		return nil, err
	}
	var info *datav1.FileInfo
	err = asUser(u, func() error {
		move := os.Rename
		if req.Msg.GetMerge() {
			move = treemove.Move
		}
		if err := move(src, dst); err != nil {
			return err
		}
		var err error
		info, err = inspect(s.accounts.names(), dst)
		return err
	})
	if err != nil {
		return nil, toConnect(stageMovingFile, err)
	}
	return connect.NewResponse(&datav1.MoveFileResponse{File: info}), nil
}

// CreateDirectory implements FileService.CreateDirectory. New
// directories get exactly mode (not reduced by a umask). With parents an
// existing directory is fine, as with mkdir -p.
func (s *FileService) CreateDirectory(ctx context.Context, req *connect.Request[datav1.CreateDirectoryRequest]) (*connect.Response[datav1.CreateDirectoryResponse], error) {
	mode := req.Msg.GetMode()
	if mode > 0o7777 {
		return nil, newError(connect.CodeInvalidArgument, stageCreatingDirectory, "mode %#o has bits beyond 07777", mode)
	}
	if mode == 0 {
		mode = 0o755
	}
	u, path, err := s.resolve(req.Msg.GetUser(), req.Msg.GetPath(), stageCreatingDirectory)
	if err != nil {
		return nil, err
	}
	perm := unixMode(os.FileMode(mode))
	var info *datav1.FileInfo
	err = asUser(u, func() error {
		var err error
		if req.Msg.GetParents() {
			err = mkdirAll(path, perm)
		} else {
			err = mkdir(path, perm)
		}
		if err != nil {
			return err
		}
		info, err = inspect(s.accounts.names(), path)
		return err
	})
	if err != nil {
		return nil, toConnect(stageCreatingDirectory, err)
	}
	return connect.NewResponse(&datav1.CreateDirectoryResponse{Directory: info}), nil
}

// mkdir creates one directory with exactly perm.
func mkdir(path string, perm os.FileMode) error {
	if err := os.Mkdir(path, perm); err != nil {
		return err
	}
	return os.Chmod(path, perm)
}

// mkdirAll creates path and its missing parents, each with exactly perm.
func mkdirAll(path string, perm os.FileMode) error {
	fi, err := os.Stat(path)
	if err == nil {
		if fi.IsDir() {
			return nil
		}
		return &os.PathError{Op: "mkdir", Path: path, Err: syscall.ENOTDIR}
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(path); parent != path {
		if err := mkdirAll(parent, perm); err != nil {
			return err
		}
	}
	err = mkdir(path, perm)
	if errors.Is(err, fs.ErrExist) {
		if fi, serr := os.Stat(path); serr == nil && fi.IsDir() {
			return nil // made by someone else meanwhile
		}
	}
	return err
}

// ListDirectory implements FileService.ListDirectory: the entries of the
// directory (a symlink to one is followed), and of its subdirectories
// down to depth levels, depth-first in name order. Symlinks below are
// not followed; a subdirectory the user may not read is listed without
// its entries.
func (s *FileService) ListDirectory(ctx context.Context, req *connect.Request[datav1.ListDirectoryRequest]) (*connect.Response[datav1.ListDirectoryResponse], error) {
	u, path, err := s.resolve(req.Msg.GetUser(), req.Msg.GetPath(), stageReadingFile)
	if err != nil {
		return nil, err
	}
	depth := max(int(min(req.Msg.GetDepth(), 1<<16)), 1)
	names := s.accounts.names()
	var (
		entries []*datav1.FileInfo
		size    int // of the answer's entries, encoded
	)
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			child := filepath.Join(dir, e.Name())
			fi, err := e.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed meanwhile
			} else if err != nil {
				return err
			}
			info := fileInfo(names, child, fi)
			size += protowire.SizeBytes(proto.Size(info)) + 1 // with its field's tag
			if len(entries) == maxListEntries || size > maxListBytes {
				hint := "list with a smaller depth"
				if depth <= 1 {
					hint = "the directory itself holds more: list it through a process (ws exec -- ls)"
				}
				return newError(connect.CodeResourceExhausted, stageReadingFile, "more than %d entries or %d MiB: %s", maxListEntries, maxListBytes>>20, hint)
			}
			entries = append(entries, info)
			if e.IsDir() && level < depth {
				err := walk(child, level+1)
				if errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					return err
				}
			}
		}
		return nil
	}
	err = asUser(u, func() error {
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return &os.PathError{Op: "list", Path: path, Err: syscall.ENOTDIR}
		}
		return walk(path, 1)
	})
	if err != nil {
		return nil, toConnect(stageReadingFile, err)
	}
	return connect.NewResponse(&datav1.ListDirectoryResponse{Entries: entries}), nil
}

// inspect returns the metadata of path itself (a final symlink is not
// followed).
func inspect(names *idNames, path string) (*datav1.FileInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return fileInfo(names, path, fi), nil
}

// apiText is s as the API can carry it: UTF-8, each run of bytes that are
// not UTF-8 (a name the guest's own programs may make) as U+FFFD, so that
// a listing or a watch of a directory holding one goes on; the name so
// shown reaches no file.
func apiText(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// fileInfo converts the Lstat of path.
func fileInfo(names *idNames, path string, fi os.FileInfo) *datav1.FileInfo {
	info := &datav1.FileInfo{
		Path:       apiText(path),
		Name:       apiText(fi.Name()),
		Size:       uint64(max(fi.Size(), 0)),
		ModifiedAt: timestamppb.New(fi.ModTime()),
	}
	switch m := fi.Mode(); {
	case m.IsRegular():
		info.Type = datav1.FileType_FILE_TYPE_FILE
	case m.IsDir():
		info.Type = datav1.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		info.Type = datav1.FileType_FILE_TYPE_SYMLINK
		if dest, err := os.Readlink(path); err == nil {
			info.SymlinkTarget = apiText(dest)
		}
	default:
		info.Type = datav1.FileType_FILE_TYPE_OTHER
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Mode = st.Mode & 0o7777
		info.Owner = names.user(st.Uid)
		info.Group = names.group(st.Gid)
	} else {
		info.Mode = uint32(fi.Mode().Perm())
	}
	return info
}
