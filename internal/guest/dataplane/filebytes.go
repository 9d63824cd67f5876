package dataplane

import (
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/guestabi"
)

// bytesBufferSize is the size of the buffer a file's bytes cross the agent
// through on the file bytes path: one read and one write a MiB.
const bytesBufferSize = 1 << 20

// ServeFileBytes serves guestabi.FileBytesPath: GET answers the bytes of
// the file the query's path (and user) names, as ReadFile reads them, with
// its FileInfo in guestabi.FileInfoHeader and, for a regular file whose
// size is what it holds (sizeIsLength), its length; PUT replaces it with the request body as WriteFile does (mode,
// octal, for a new file; a Content-Length is the exact size), and answers
// the WriteFileResponse as JSON. Only a body received whole is written: one
// that ends short of its length or its last chunk leaves the old file. An
// error is a Connect error (JSON, with its HTTP status), or, once a GET's
// bytes have started, a connection cut before the length or the last chunk.
func (s *FileService) ServeFileBytes(w http.ResponseWriter, r *http.Request) {
	var err error
	switch r.Method {
	case http.MethodGet:
		err = s.getFileBytes(w, r)
	case http.MethodPut:
		err = s.putFileBytes(w, r)
	default:
		w.Header().Set("Allow", "GET, PUT")
		http.Error(w, "use GET to read a file, PUT to write one", http.StatusMethodNotAllowed)
		return
	}
	if err != nil {
		connect.NewErrorWriter().Write(w, r, err)
	}
}

// getFileBytes answers a GET; an error it returns is one to answer, before
// any byte of the file was sent.
func (s *FileService) getFileBytes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	f, info, err := s.openToRead(q.Get("user"), q.Get("path"))
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := proto.Marshal(info)
	if err != nil {
		return toConnect(stageReadingFile, err)
	}
	h := w.Header()
	h.Set(guestabi.FileInfoHeader, base64.StdEncoding.EncodeToString(b))
	h.Set("Content-Type", "application/octet-stream")
	var src io.Reader = f
	if info.GetType() == datav1.FileType_FILE_TYPE_FILE && sizeIsLength(f, info.GetSize()) {
		// The length stat gave; a file that grows meanwhile is cut there.
		h.Set("Content-Length", strconv.FormatUint(info.GetSize(), 10))
		if sendFile(w, f, int64(info.GetSize())) {
			return nil
		}
		src = io.LimitReader(f, int64(info.GetSize()))
	}
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, bytesBufferSize)
	if _, err := io.CopyBuffer(writerOnly{w}, src, buf); err != nil {
		// Too late for an error answer: cut the response short, so the
		// caller sees it incomplete rather than a shorter file.
		panic(http.ErrAbortHandler)
	}
	return nil
}

// sizeIsLength reports whether a regular file's size is the length of
// what reading it gives. It is not for the files a kernel filesystem
// makes up as they are read (proc's say 0 bytes, sysfs's 4096), which are
// read to their end with no length announced, nor for an empty file,
// which may be one of them.
func sizeIsLength(f *os.File, size uint64) bool {
	if size == 0 {
		return false
	}
	var st unix.Statfs_t
	if unix.Fstatfs(int(f.Fd()), &st) != nil {
		return true
	}
	switch st.Type {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC,
		unix.DEBUGFS_MAGIC, unix.TRACEFS_MAGIC, unix.SECURITYFS_MAGIC:
		return false
	}
	return true
}

// sendFile answers a GET with w's header and size bytes of f by taking
// the connection over and sending the file with sendfile(2): the bytes go
// from the page cache to the socket, not through a buffer of the agent
// twice. The connection is closed after it (the gateway opens one for
// each GET). It reports false, with nothing written, where the
// connection cannot be taken over (HTTP/2). A failure once the header is
// out cuts the connection short of the length, as the copy does.
func sendFile(w http.ResponseWriter, f *os.File, size int64) bool {
	conn, buffered, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	defer conn.Close()
	// The server's deadlines go with it; the gateway ends the call by
	// closing its side.
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return true
	}
	buffered.WriteString("HTTP/1.1 200 OK\r\n")
	w.Header().Set("Connection", "close")
	w.Header().Write(buffered)
	buffered.WriteString("\r\n")
	if err := buffered.Flush(); err != nil {
		return true
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		io.CopyBuffer(conn, io.LimitReader(f, size), make([]byte, bytesBufferSize))
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	var off int64
	raw.Write(func(fd uintptr) bool {
		for off < size {
			n, err := unix.Sendfile(int(fd), int(f.Fd()), &off, int(min(size-off, 1<<30)))
			switch {
			case err == unix.EAGAIN:
				return false // wait until the socket takes more
			case err == unix.EINTR:
			case err != nil || n == 0: // the gateway went, or the file shrank
				return true
			}
		}
		return true
	})
	return true
}

// putFileBytes answers a PUT.
func (s *FileService) putFileBytes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var mode uint64
	if m := q.Get("mode"); m != "" {
		var err error
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
			return newError(connect.CodeInvalidArgument, stageWritingFile, "mode %q is not an octal mode of at most 07777", m)
		}
	}
	info, err := s.replaceFile(r.Context(), q.Get("user"), q.Get("path"), uint32(mode), func(f *os.File) error {
		// The body reports a short length, or a chunked body without its
		// last chunk, as an error, so such a body is never committed.
		_, err := io.CopyBuffer(writerOnly{f}, r.Body, make([]byte, bytesBufferSize))
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return newError(connect.CodeAborted, stageWritingFile, "the body ended before its end: nothing was written")
		}
		return err
	})
	if err != nil {
		return err
	}
	b, err := protojson.Marshal(&datav1.WriteFileResponse{File: info})
	if err != nil {
		return toConnect(stageWritingFile, err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(b)
	return nil
}

// writerOnly hides every method but Write, so that io.CopyBuffer copies
// through the buffer it is given: an *os.File's ReadFrom and the HTTP
// server's take a small one of their own for sources they cannot splice.
type writerOnly struct{ io.Writer }
