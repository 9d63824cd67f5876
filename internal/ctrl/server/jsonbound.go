package server

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// boundJSON serves next with the body of a JSON request read through a
// jsonElements counter: protojson decodes each object, array element and
// map entry into an allocation of tens of bytes or more, from as little as
// 3 bytes of the request ("{},"), so a JSON request is held to the
// element bound of a binary one (maxRequestElements) as it is read.
func boundJSON(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Content-Type"), "json") {
			r.Body = &jsonElements{ReadCloser: r.Body, budget: maxRequestElements}
		}
		next.ServeHTTP(w, r)
	})
}

// jsonElements reads JSON and fails once it has passed more than budget
// of the characters that open an object or an array, or separate their
// members ('{', '[', ','), outside strings: every element decoded costs
// one of them.
type jsonElements struct {
	io.ReadCloser
	budget   int
	inString bool
	escaped  bool
}

func (j *jsonElements) Read(p []byte) (int, error) {
	n, err := j.ReadCloser.Read(p)
	for _, c := range p[:n] {
		switch {
		case j.escaped:
			j.escaped = false
		case j.inString:
			switch c {
			case '\\':
				j.escaped = true
			case '"':
				j.inString = false
			}
		case c == '"':
			j.inString = true
		case c == '{' || c == '[' || c == ',':
			if j.budget--; j.budget < 0 {
				return 0, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
					"the request holds more than %d elements (objects, array values and members), the most a request may", maxRequestElements))
			}
		}
	}
	return n, err
}
