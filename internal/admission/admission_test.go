package admission

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
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
