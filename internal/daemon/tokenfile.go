package daemon

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/sdk/bearer"
)

// tokenFile is a host token that the agent reads from its file again for
// each call to the control plane and sends as bearer.Token does, so that an operator replaces a revoked
// token by writing the file, with no restart. A file that cannot be read
// or is empty (being rewritten) leaves the last token read.
type tokenFile struct {
	path string
	mu   sync.Mutex
	last string
}

// newTokenFile reads the host token at path, which must be there.
func newTokenFile(path string) (*tokenFile, error) {
	token, err := readSecretFile("host token", path)
	if err != nil {
		return nil, err
	}
	return &tokenFile{path: path, last: token}, nil
}

// token returns the file's token now.
func (f *tokenFile) token() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := os.ReadFile(f.path)
	if token := strings.TrimSpace(string(b)); err == nil && token != "" && token != f.last {
		slog.Info("the host token file holds a new token: the agent uses it from now on", "file", f.path)
		f.last = token
	}
	return f.last
}

// WrapUnary implements connect.Interceptor.
func (f *tokenFile) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		return bearer.Token(f.token()).WrapUnary(next)(ctx, req)
	}
}

// WrapStreamingClient implements connect.Interceptor.
func (f *tokenFile) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		return bearer.Token(f.token()).WrapStreamingClient(next)(ctx, spec)
	}
}

// WrapStreamingHandler implements connect.Interceptor; the agent's client
// only.
func (f *tokenFile) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
