package auth

import (
	"context"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/errdetail"
)

// gateSmall is the largest request that passes the Gate without its token
// authenticated first: decoding it costs little whatever it holds.
const gateSmall = 64 << 10

// Gate serves next, a Connect handler, refusing before it reads the
// request a call whose token does not authenticate (check, given the
// Authorization header, returns the refusal) and whose request may be
// larger than gateSmall (or of unknown length, as a stream is): a
// handler decodes a request message, up to 8 MiB, before its
// interceptors authenticate the call, and a repeated field of empty
// messages takes a hundred times its bytes in memory. Smaller requests
// go on, to be refused by the interceptors as usual, logged and counted.
// The Gate tells refused of each call it refuses, which started at start.
func Gate(next http.Handler, check func(ctx context.Context, header string) error, refused func(r *http.Request, start time.Time, err error)) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength >= 0 && r.ContentLength <= gateSmall || !errs.IsSupported(r) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		if err := check(r.Context(), r.Header.Get("Authorization")); err != nil {
			err = errdetail.Complete(err)
			refused(r, start, err)
			errs.Write(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}
