package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httputil"

	"go.opentelemetry.io/otel/propagation"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// getFileBytes carries a GET of the file bytes path (guestabi.FileBytesPath)
// on a connection to the guest of its own, and hands the file's bytes from
// that socket to the caller's connection as they are: on a caller's
// HTTP/1.1 connection over TCP, the response writer's ReadFrom moves them
// with splice(2), so they never enter this process. Any other answer (an
// error, a length the guest did not give) is copied through; only the
// data plane's headers pass (keepDataPlaneHeaders), and an interim or
// protocol-switching answer is refused, as the proxy of the other calls
// refuses it.
func (g *gateway) getFileBytes(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	guest, _ := ctx.Value(guestKey{}).(string)
	dialCtx, cancel := context.WithTimeout(ctx, guestDialTimeout)
	conn, err := g.agent.cfg.Driver.DialGuest(dialCtx, guest, guestabi.DataSocket)
	cancel()
	if err != nil {
		g.proxyError(w, r, err)
		return
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() }) // the caller left or the session ended
	defer stop()

	out, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+guest+guestabi.FileBytesPath+"?"+r.URL.RawQuery, nil)
	if err != nil {
		g.proxyError(w, r, err)
		return
	}
	out.Close = true
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(out.Header))
	// The header is read through a limit (maxGuestHeaderBytes), lifted
	// once it is read: the file's bytes follow it.
	head := &io.LimitedReader{R: conn, N: maxGuestHeaderBytes}
	guestReader := bufio.NewReaderSize(head, 64<<10)
	var resp *http.Response
	if err = out.Write(conn); err == nil {
		resp, err = http.ReadResponse(guestReader, out)
	}
	head.N = math.MaxInt64
	if err == nil && resp.StatusCode < http.StatusOK {
		resp.Body.Close()
		err = fmt.Errorf("the guest answered a GET of a file's bytes with %s", resp.Status)
	}
	if err != nil {
		g.proxyError(w, r, err)
		return
	}
	defer resp.Body.Close()
	keepDataPlaneHeaders(resp.Header)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	if resp.StatusCode != http.StatusOK || resp.ContentLength < 0 || resp.TransferEncoding != nil {
		_, err = io.Copy(w, resp.Body)
	} else {
		// What the header's read buffered first, then the rest from the socket.
		buffered := min(int64(guestReader.Buffered()), resp.ContentLength)
		if _, err = io.CopyN(w, guestReader, buffered); err == nil {
			_, err = io.CopyN(w, conn, resp.ContentLength-buffered)
		}
	}
	if err != nil {
		// Cut short: the guest aborted, the session ended, the caller
		// left. The answer must not end as if whole (a chunked one would
		// get its last chunk): abort it, which resets an HTTP/2 stream
		// and closes an HTTP/1.1 connection.
		panic(http.ErrAbortHandler)
	}
}

// rewriteFileBytes is rewrite for a PUT of the file bytes path, whose body
// goes on to the guest chunked, through bulkBody's buffer of a MiB: the
// transport copies a body of known length 32 KiB at a time, a read and a
// write each. The caller's length still holds: a body that ends short of it
// fails, and the guest, missing the last chunk, writes nothing.
func rewriteFileBytes(pr *httputil.ProxyRequest) {
	rewrite(pr)
	if pr.Out.Body != nil && pr.Out.Body != http.NoBody {
		pr.Out.Body = bulkBody{pr.Out.Body}
		pr.Out.ContentLength = -1
		pr.Out.Header.Del("Content-Length")
	}
}

// bulkBody is a request body that copies itself through a buffer of a MiB.
type bulkBody struct{ io.ReadCloser }

func (b bulkBody) WriteTo(w io.Writer) (int64, error) {
	buf := readFileBuffers.Get()
	defer readFileBuffers.Put(buf)
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{b.ReadCloser}, buf)
}
