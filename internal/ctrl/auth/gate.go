package auth

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/admission"
	"github.com/kibotos/kibotos/internal/callshare"
	"github.com/kibotos/kibotos/internal/errdetail"
)

// gateSmall is the largest request that passes the Gate without its token
// authenticated first: decoding it costs little whatever it holds.
const gateSmall = 64 << 10

// refusedBodyTimeout is how long the body of a small request whose token
// does not authenticate may take to arrive (admission.BodyTimeout), so
// that a client with no token cannot hold a connection by sending the
// body a byte at a time.
var refusedBodyTimeout = admission.BodyTimeout

// Gate serves next, a Connect handler, after checking each call's token
// (check, given the call's procedure and Authorization header, returns who
// the token authenticates, or the refusal: of a token that does not
// authenticate, or whose role may not call the procedure).
//
// A call check refuses is refused before its request is read when the
// request may be larger than gateSmall (or is of unknown length, as a
// stream is): a handler decodes a request message, up to 8 MiB, before its
// interceptors authenticate the call and check its role. Smaller requests
// go on, to be refused by the interceptors as usual, logged and counted,
// but their body must arrive within refusedBodyTimeout.
//
// A call whose token authenticates counts against its caller's share of
// calls (calls, nil for no bound) until it ends; a call over it is
// resource_exhausted before its request is read. The Gate tells refused
// of each call it refuses, which started at start, and answers it with the
// error refused returns (as the interceptors would answer it).
func Gate(next http.Handler, check func(ctx context.Context, procedure, header string) (string, error), calls *callshare.Shares,
	refused func(r *http.Request, start time.Time, err error) error) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !errs.IsSupported(r) {
			next.ServeHTTP(w, r)
			return
		}
		start := time.Now()
		refuse := func(err error) {
			err = errdetail.Complete(refused(r, start, err))
			admission.Refuse(w, r)
			errs.Write(w, r, err)
		}
		caller, err := check(r.Context(), r.URL.Path, r.Header.Get("Authorization"))
		if err != nil {
			if r.ContentLength < 0 || r.ContentLength > gateSmall {
				refuse(err)
				return
			}
			http.NewResponseController(w).SetReadDeadline(start.Add(refusedBodyTimeout))
			next.ServeHTTP(w, r)
			return
		}
		release, ok := calls.Take(caller)
		if !ok {
			refuse(connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
				"%d calls of this token's %s are in flight, the most one may have at once; end some (a watch, an upload or a download) before starting another",
				calls.Max(), callerKind(caller))))
			return
		}
		defer release()
		admission.Admit(w)
		next.ServeHTTP(w, r)
	})
}

// callerKind names what a caller key of the Gate is, for its refusals.
func callerKind(caller string) string {
	if strings.HasPrefix(caller, HostCallerPrefix) {
		return "host"
	}
	return "project"
}

// HostCallerPrefix starts the Gate's key of a host token's calls, which
// keeps them apart from a project's.
const HostCallerPrefix = "host-token:"
