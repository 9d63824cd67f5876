// Package admission keeps a request that no handler admitted from holding
// its connection. The server's own timeouts cover a request's header, and
// an idle connection, but nothing covers a body: a client that declares
// one and sends it a byte at a time, or never, held its connection for
// ever, whatever path it named (a 404, the console, the probes). Guard
// gives every request BodyTimeout to arrive whole; a handler that admits
// a call (its token authenticates, its exposure lets it in) lifts that
// with Admit, so that streams and slow uploads go on; one that refuses a
// call reads little more of it with Refuse.
package admission

import (
	"net/http"
	"time"
)

// BodyTimeout is how long a request no handler admitted may take to
// arrive: as long as its header may (the server's ReadHeaderTimeout).
const BodyTimeout = 10 * time.Second

// Guard serves next with each request's read deadline BodyTimeout from
// its start.
func Guard(next http.Handler) http.Handler { return guard(next, BodyTimeout) }

func guard(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(timeout))
		next.ServeHTTP(w, r)
	})
}

// Admit lifts the read deadline of a request a handler admitted.
func Admit(w http.ResponseWriter) {
	http.NewResponseController(w).SetReadDeadline(time.Time{})
}

// Refuse bounds what a refused request may still send to RefuseGrace
// after its answer, and closes its HTTP/1.1 connection: the server would
// otherwise wait for the body (for ever, from a client that sends none)
// to reuse the connection. The grace is what lets a client still sending
// its body read the answer: the server reads up to 256 KiB more, then
// ends its side and waits a moment before it closes. Closed at once with
// the client's bytes unread, the connection is reset while the client
// still writes, and a client whose write fails first (Node.js's fetch)
// reports the reset, not the refusal. Over HTTP/2 the
// connection is kept: a Connection: close there is a GOAWAY to every call
// it carries.
func Refuse(w http.ResponseWriter, r *http.Request) {
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(RefuseGrace))
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
}

// RefuseGrace is how long a refused request's body is still read after
// its answer.
const RefuseGrace = time.Second
