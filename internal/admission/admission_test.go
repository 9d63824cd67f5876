package admission

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testutil"
)

// send opens a connection to srv and sends a request's head, declaring a
// body of 1000 bytes, and no body.
func send(t *testing.T, srv *httptest.Server, path string) net.Conn {
	t.Helper()
	return testutil.SendHead(t, srv.Listener.Addr().String(), "POST "+path+" HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
}

// A request no handler admits, whatever it names, cannot hold its
// connection past the timeout by never sending its body; one admitted
// may send it late; one refused is answered and closed at once.
func TestGuard(t *testing.T) {
	const timeout = 200 * time.Millisecond
	mux := http.NewServeMux()
	mux.HandleFunc("/admitted", func(w http.ResponseWriter, r *http.Request) {
		Admit(w)
		b, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write(b[:1])
	})
	mux.HandleFunc("/refused", func(w http.ResponseWriter, r *http.Request) {
		Refuse(w, r)
		http.Error(w, "no", http.StatusUnauthorized)
	})
	srv := httptest.NewServer(guard(mux, timeout))
	t.Cleanup(srv.Close)

	for _, path := range []string{"/nope", "/refused"} {
		conn := send(t, srv, path)
		conn.SetReadDeadline(time.Now().Add(20 * timeout))
		if b, err := io.ReadAll(conn); err != nil {
			t.Errorf("%s: the server still holds the connection after %v (read %q): %v", path, 20*timeout, b, err)
		}
	}

	conn := send(t, srv, "/admitted")
	time.Sleep(3 * timeout)
	io.WriteString(conn, strings.Repeat("x", 1000))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if status, err := bufio.NewReader(conn).ReadString('\n'); err != nil || !strings.Contains(status, "200") {
		t.Errorf("an admitted request whose body came late: %q, %v", status, err)
	}
}

// A refused request whose client is still sending a streamed body gets
// the answer before the connection is reset: closed at once with the body
// unread, the connection was reset while the client wrote, and a client
// whose write then fails (Node.js's fetch) reported the reset, not the
// answer.
func TestRefusedUploadIsAnswered(t *testing.T) {
	srv := httptest.NewServer(Guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		Refuse(w, r)
		http.Error(w, "no", http.StatusUnauthorized)
	})))
	t.Cleanup(srv.Close)
	chunk := fmt.Sprintf("%x\r\n%s\r\n", 64<<10, strings.Repeat("x", 64<<10))
	for i := range 10 {
		// Chunked, as fetch streams a body: of no length the server could
		// tell is too long to read.
		conn := testutil.SendHead(t, srv.Listener.Addr().String(), "PUT /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
		var writeErr atomic.Pointer[error]
		go func() {
			for range 1024 {
				if _, err := io.WriteString(conn, chunk); err != nil {
					writeErr.Store(&err)
					return
				}
			}
		}()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		answer, err := io.ReadAll(conn)
		if err != nil || !strings.HasPrefix(string(answer), "HTTP/1.1 401") {
			t.Fatalf("upload %d: read %q, %v; want the refusal, then the connection's end", i, answer, err)
		}
		if err := writeErr.Load(); err != nil {
			t.Fatalf("upload %d: the upload failed before its answer was read: %v", i, *err)
		}
		conn.Close()
	}
}
