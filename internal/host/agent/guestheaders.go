package agent

import (
	"net/http"
	"strings"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// This file is what headers cross the gateway between a caller and a guest
// agent: what the data-plane protocols (Connect, gRPC, gRPC-Web and the file
// bytes path) need, and nothing else. Nothing in a guest is trusted: a
// caller's cookies, or the identity headers a proxy in front of the
// deployment adds, are not the guest's to read; a guest's Set-Cookie,
// Clear-Site-Data, CORS or Refresh headers are not its to give the
// deployment's origin, which the web console shares.

// dataPlaneHeader says whether the header of this canonical name crosses
// the gateway.
func dataPlaneHeader(name string) bool {
	switch name {
	case "Content-Type", "Content-Encoding", "Content-Length", "Accept-Encoding", "Te", guestabi.FileInfoHeader:
		return true
	}
	if rest, ok := strings.CutPrefix(name, "Trailer-"); ok { // a Connect unary answer's trailer
		return dataPlaneHeader(rest)
	}
	return strings.HasPrefix(name, "Connect-") || strings.HasPrefix(name, "Grpc-")
}

// keepDataPlaneHeaders deletes from h every header that does not cross
// the gateway.
func keepDataPlaneHeaders(h http.Header) {
	for name := range h {
		if !dataPlaneHeader(http.CanonicalHeaderKey(name)) {
			delete(h, name)
		}
	}
}
