package agent

import (
	"net/http"

	connectcors "connectrpc.com/cors"
	"github.com/rs/cors"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// AllowOrigins lets pages of origins (the web console's, served by the
// control plane at another origin than this host's public URL) call h
// from a browser: it answers their CORS preflight requests and makes
// their calls' responses readable, with the methods and headers the
// Connect, gRPC-Web and gRPC protocols, the file bytes path and the
// session token need.
// Cookies are not allowed: a call carries its session token in
// Authorization. A request from any other origin is served as it would
// be without CORS, so a browser keeps its responses from that page.
func AllowOrigins(h http.Handler, origins []string) http.Handler {
	return cors.New(cors.Options{
		AllowedOrigins: origins,
		// PUT writes a file on the file bytes path; a GET there answers
		// the file's metadata in a header of its own.
		AllowedMethods: append(connectcors.AllowedMethods(), http.MethodPut),
		AllowedHeaders: append(connectcors.AllowedHeaders(), "Authorization"),
		ExposedHeaders: append(connectcors.ExposedHeaders(), guestabi.FileInfoHeader),
		MaxAge:         7200, // seconds a browser may keep a preflight's answer
	}).Handler(h)
}
