package dataplane

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/guestabi"
)

// maxMessage bounds one request message (a WriteFile data chunk, say),
// so a caller cannot make the agent buffer more.
const maxMessage = 16 << 20

// NewHandler serves the ProcessService, the FileService (and its file bytes
// path, guestabi.FileBytesPath), the
// ServiceService, and the ScreenService and InputService of display with
// Connect (and gRPC, gRPC-Web), uncompressed. A panic in a handler becomes an internal
// error instead of ending the agent, the guest's PID 1. A request message
// may be up to 16 MiB.
func NewHandler(procs *ProcessService, files *FileService, services *ServiceService, display *DisplayService, opts ...connect.HandlerOption) http.Handler {
	logf := procs.logf
	recovering := connect.WithRecover(func(ctx context.Context, spec connect.Spec, _ http.Header, p any) error {
		logf("panic in %s: %v\n%s", spec.Procedure, p, debug.Stack())
		return connect.NewError(connect.CodeInternal, fmt.Errorf("internal error"))
	})
	// Nothing is compressed: the gateway and the caller are a unix socket
	// and a network hop away, and gzip would cost the guest's CPU on every
	// message (a compressor's reset alone on each small process event), on
	// data that is often compressed already.
	opts = append([]connect.HandlerOption{recovering, connect.WithReadMaxBytes(maxMessage),
		connect.WithCompression("gzip", nil, nil)}, opts...)
	mux := http.NewServeMux()
	mux.Handle(datav1connect.NewProcessServiceHandler(procs, opts...))
	mux.Handle(datav1connect.NewFileServiceHandler(files, opts...))
	mux.HandleFunc(guestabi.FileBytesPath, files.ServeFileBytes)
	mux.Handle(datav1connect.NewServiceServiceHandler(services, opts...))
	mux.Handle(datav1connect.NewScreenServiceHandler(display, opts...))
	mux.Handle(datav1connect.NewInputServiceHandler(display, opts...))
	return mux
}

// NewServer returns an HTTP server for h that speaks HTTP/1.1 and
// cleartext HTTP/2 with prior knowledge (h2c), which the host's gateway
// uses over the guest's unix socket.
func NewServer(h http.Handler) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &protocols,
		HTTP2:             guestabi.DataSocketHTTP2(),
		ReadHeaderTimeout: 10 * time.Second,
	}
}
