package sdk

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// FileBytesPath is the path, on a session's endpoint, of a file's bytes
// over plain HTTP, with the session token as Authorization: Bearer: GET
// ?path=P[&user=U] answers the file's bytes, PUT ?path=P[&user=U][&mode=0644]
// replaces it with the request's body, as WriteFile does (only a body
// received whole is written). Upload and Download use it; without a
// message framing to copy every byte through, it moves large files
// several times faster than FileService's streams. Errors are Connect
// errors in JSON, with their HTTP status.
const FileBytesPath = "/kibotos.data.v1.files"

// FileInfoHeader carries the FileInfo of the file a GET of FileBytesPath
// reads: base64 of its protobuf encoding.
const FileInfoHeader = "Kibotos-File-Info"

// bytesBufferSize is the buffer a file's bytes are copied through.
const bytesBufferSize = 1 << 20

// errNoFileBytes reports a data plane too old to serve FileBytesPath.
var errNoFileBytes = errors.New("the data plane does not serve " + FileBytesPath)

// What a dataPlane knows of its endpoint's FileBytesPath.
const (
	fileBytesUnknown int32 = iota
	fileBytesServed
	fileBytesNotServed
)

// servesFileBytes reports whether d's endpoint serves FileBytesPath,
// asking it the first time with a GET that names no file: the path
// answers invalid_argument, a data plane without it 404.
func (c *Client) servesFileBytes(ctx context.Context, d *dataPlane) (bool, error) {
	if known := d.fileBytes.Load(); known != fileBytesUnknown {
		return known == fileBytesServed, nil
	}
	resp, err := c.fileBytes(ctx, d, http.MethodGet, nil, nil, 0)
	switch {
	case errors.Is(err, errNoFileBytes):
		return false, nil
	case connect.CodeOf(err) == connect.CodeInvalidArgument:
		d.fileBytes.Store(fileBytesServed)
		return true, nil
	case err == nil:
		resp.Body.Close()
		return false, connect.NewError(connect.CodeInternal, errors.New(FileBytesPath+" answered a GET without a path"))
	}
	return false, err
}

// fileBytes sends one request of FileBytesPath through d's session and
// returns its response when it succeeded; an error answer is returned as
// the *connect.Error it carries.
func (c *Client) fileBytes(ctx context.Context, d *dataPlane, method string, query url.Values, body io.Reader, length int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, d.session.Endpoint+FileBytesPath+"?"+query.Encode(), body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.ContentLength = length // -1: chunked
		req.Header.Set("Content-Type", "application/octet-stream")
	}
	req.Header.Set("Authorization", "Bearer "+d.session.Token)
	resp, err := c.bulk.Do(req)
	if err != nil {
		if ce := new(connect.Error); errors.As(err, &ce) {
			return nil, ce
		}
		return nil, transportError(ctx, err)
	}
	if resp.StatusCode == http.StatusOK {
		d.fileBytes.Store(fileBytesServed)
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	ctype, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode == http.StatusNotFound && ctype != "application/json" {
		d.fileBytes.Store(fileBytesNotServed) // a guest agent's mux without the path
		return nil, errNoFileBytes
	}
	return nil, wireError(resp.StatusCode, b)
}

// transportError is the Connect error of a request of FileBytesPath that
// failed on its way: canceled or deadline_exceeded when ctx ended, which
// a retry would not mend; else unavailable (retry it).
func transportError(ctx context.Context, err error) error {
	var already *connect.Error
	switch cerr := ctx.Err(); {
	case errors.Is(cerr, context.Canceled):
		return connect.NewError(connect.CodeCanceled, fmt.Errorf("%w: %w", cerr, err))
	case errors.Is(cerr, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("%w: %w", cerr, err))
	case errors.As(err, &already):
		return already // the transport said it (a broken connection: unavailable)
	}
	return connect.NewError(connect.CodeUnavailable, err)
}

// wireError decodes a Connect error written as JSON (the gateway's and the
// guest's answers on FileBytesPath) into a *connect.Error with its
// details; anything else becomes an error of the HTTP status.
func wireError(status int, body []byte) error {
	var wire struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Details []struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"details"`
	}
	var code connect.Code
	if json.Unmarshal(body, &wire) != nil || code.UnmarshalText([]byte(wire.Code)) != nil {
		return connect.NewError(connect.CodeUnknown, fmt.Errorf("HTTP %d: %s", status, strings.TrimSpace(string(body))))
	}
	err := connect.NewWireError(code, errors.New(wire.Message))
	for _, d := range wire.Details {
		v, derr := base64.RawStdEncoding.DecodeString(strings.TrimRight(d.Value, "="))
		if derr != nil {
			continue
		}
		msg, derr := anypb.UnmarshalNew(&anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type, Value: v}, proto.UnmarshalOptions{})
		if derr != nil {
			continue
		}
		if detail, derr := connect.NewErrorDetail(msg); derr == nil {
			err.AddDetail(detail)
		}
	}
	return err
}

// downloadBytes is one GET of remotePath into dst.
func (c *Client) downloadBytes(ctx context.Context, d *dataPlane, remotePath string, dst io.Writer, o fileOptions) (int64, error) {
	resp, err := c.fileBytes(ctx, d, http.MethodGet, url.Values{"path": {remotePath}, "user": {o.user}}, nil, 0)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var read *datav1.FileInfo // the file as the read began
	if b, err := base64.StdEncoding.DecodeString(resp.Header.Get(FileInfoHeader)); err == nil && len(b) > 0 {
		if info := new(datav1.FileInfo); proto.Unmarshal(b, info) == nil {
			read = info
		}
	}
	if o.info != nil && read != nil {
		o.info(read)
	}
	buf := make([]byte, bytesBufferSize)
	steps := progressSteps{report: o.progress}
	var n int64
	for {
		m, rerr := resp.Body.Read(buf)
		if m > 0 {
			w, werr := dst.Write(buf[:m])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
			steps.moved(n, false)
		}
		if rerr == io.EOF {
			steps.moved(n, true)
			return n, nil
		}
		if rerr != nil {
			if errors.Is(rerr, io.ErrUnexpectedEOF) && read != nil {
				if err := changedWhileRead(ctx, d, remotePath, o.user, read); err != nil {
					return n, err
				}
			}
			return n, transportError(ctx, rerr)
		}
	}
}

// changedWhileRead tells a download cut short by its file from one cut by
// the connection: the guest announced the file's length, and a file that
// shrank (or was replaced) under the read ends the body early, just as a
// broken connection does. It returns an aborted error when the file now
// differs from read, the file as the read began; nil when it does not, or
// cannot be inspected.
func changedWhileRead(ctx context.Context, d *dataPlane, path, user string, read *datav1.FileInfo) error {
	resp, err := d.files.InspectFile(ctx, connect.NewRequest(&datav1.InspectFileRequest{Path: path, User: user}))
	if err != nil {
		return nil
	}
	now := resp.Msg.GetFile()
	if now.GetType() == datav1.FileType_FILE_TYPE_SYMLINK || // what was read is its target's
		now.GetSize() == read.GetSize() && now.GetModifiedAt().AsTime().Equal(read.GetModifiedAt().AsTime()) {
		return nil
	}
	return connect.NewError(connect.CodeAborted, fmt.Errorf("%s changed while it was read (%d bytes when the read began, %d now); read it again",
		path, read.GetSize(), now.GetSize()))
}

// uploadBytes is one PUT of r's bytes to start.Path. read counts the bytes
// read from r, sent or not.
func (c *Client) uploadBytes(ctx context.Context, d *dataPlane, r io.Reader, start *datav1.WriteFileStart, progress func(int64)) (_ *datav1.FileInfo, read int64, _ error) {
	length := knownLength(r)
	query := url.Values{"path": {start.GetPath()}, "user": {start.GetUser()}, "mode": {strconv.FormatUint(uint64(start.GetMode()), 8)}}
	body := &countingReader{r: r, steps: progressSteps{report: progress}}
	var src io.Reader = body
	if length < 0 {
		// A stream may block (a pipe, a terminal), and the transport
		// reads a body to its end even after ctx ended: fed through a
		// pipe that ctx closes, the call ends with ctx.
		fed := feedUntilDone(ctx, body)
		defer fed.close()
		src = fed
	}
	resp, err := c.fileBytes(ctx, d, http.MethodPut, query, src, length)
	read, rerr := body.counts()
	if rerr != nil {
		// The transport ended the request when r failed: the guest
		// received no end, so it wrote nothing.
		return nil, read, fmt.Errorf("reading the upload: %w", rerr)
	}
	if err != nil {
		return nil, read, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, read, transportError(ctx, err)
	}
	out := new(datav1.WriteFileResponse)
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, out); err != nil {
		return nil, read, connect.NewError(connect.CodeInternal, fmt.Errorf("the answer of the upload: %w", err))
	}
	return out.GetFile(), read, nil
}

// fedBody is a request body that a goroutine feeds from a reader through
// a pipe, which ends with a context's error when the context ends: its
// reader ends then, however long the source blocks (the goroutine ends at
// its next write).
type fedBody struct {
	pr   *io.PipeReader
	stop func() bool
}

// close ends the pipe once the request is over, read or not: the
// goroutine ends at its next write.
func (b *fedBody) close() {
	b.stop()
	b.pr.Close()
}

// feedUntilDone returns the body of src that ends with ctx.
func feedUntilDone(ctx context.Context, src io.WriterTo) *fedBody {
	pr, pw := io.Pipe()
	go func() {
		_, err := src.WriteTo(pw)
		pw.CloseWithError(err) // the first error stays: ctx's, when it came first
	}()
	return &fedBody{pr: pr, stop: context.AfterFunc(ctx, func() { pw.CloseWithError(ctx.Err()) })}
}

func (b *fedBody) Read(p []byte) (int, error) { return b.pr.Read(p) }

// WriteTo keeps the source's pieces of up to a MiB (see countingReader).
func (b *fedBody) WriteTo(w io.Writer) (int64, error) {
	return io.CopyBuffer(struct{ io.Writer }{w}, b.pr, make([]byte, bytesBufferSize))
}

// knownLength returns how many bytes r holds, or -1 when it cannot tell: a
// bytes.Reader, strings.Reader or bytes.Buffer says, and a regular file
// holds from its offset to its end. A body of known length is read by the
// gateway in large reads; a chunked one a chunk at a time.
func knownLength(r io.Reader) int64 {
	switch r := r.(type) {
	case interface{ Len() int }:
		return int64(r.Len())
	case *os.File:
		st, err := r.Stat()
		if err != nil || !st.Mode().IsRegular() {
			return -1
		}
		if off, err := r.Seek(0, io.SeekCurrent); err == nil && off <= st.Size() {
			return st.Size() - off
		}
	}
	return -1
}

// countingReader counts what it reads, reports its progress, and keeps
// the first error of r other than io.EOF.
type countingReader struct {
	r     io.Reader
	steps progressSteps

	mu  sync.Mutex // n and err: a fedBody's goroutine may still read
	n   int64
	err error
}

// counts returns how many bytes were read, and the first error.
func (c *countingReader) counts() (int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.err
}

// WriteTo copies what c reads to w through a buffer of a MiB: sent
// chunked, a body becomes chunks of up to that size, where the transport's
// own copy would cut it into chunks of 32 KiB, each a read of its own for
// the gateway.
func (c *countingReader) WriteTo(w io.Writer) (int64, error) {
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{c}, make([]byte, bytesBufferSize))
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.mu.Lock()
	c.n += int64(n)
	total := c.n
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.steps.moved(total, err == io.EOF)
	return n, err
}

// progressSteps reports the bytes moved to WithProgress's function as
// the upload through messages did: once a ChunkSize or more moved since
// the last report, and at the end.
type progressSteps struct {
	report   func(int64)
	reported int64
}

func (s *progressSteps) moved(done int64, end bool) {
	if s.report == nil || done == s.reported {
		return
	}
	if end || done-s.reported >= ChunkSize {
		s.reported = done
		s.report(done)
	}
}
