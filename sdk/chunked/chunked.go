// Package chunked moves bytes as the API's streaming calls carry them: a
// reader sent in chunks of a fixed size (Send), and the rule that ends a
// client-streaming call (Receive).
package chunked

import (
	"errors"
	"io"

	"connectrpc.com/connect"
)

// Size is the size of the chunks the clients send: 1 MiB.
const Size = 1 << 20

// Send reads r to its end in chunks of at most size bytes and calls send
// with each, in order; send must not keep the chunk, whose buffer is
// reused. It returns the bytes read from r, sent or not, and the error of
// reading r (readErr) or the error of send (sendErr), whichever stopped it.
func Send(r io.Reader, size int, send func(chunk []byte) error) (read int64, readErr, sendErr error) {
	buf := make([]byte, size)
	for {
		n, err := io.ReadFull(r, buf)
		read += int64(n)
		if n > 0 {
			if err := send(buf[:n]); err != nil {
				return read, nil, err
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return read, nil, nil
		}
		if err != nil {
			return read, err, nil
		}
	}
}

// Receive ends a client-streaming call whose sending stopped with sendErr
// (nil when every message was sent) and returns the server's response. A
// Send that failed with io.EOF means the server ended the call: the error
// it ended it with is what Receive returns then.
func Receive[Req, Resp any](stream *connect.ClientStreamForClient[Req, Resp], sendErr error) (*Resp, error) {
	if sendErr != nil && !errors.Is(sendErr, io.EOF) {
		return nil, sendErr
	}
	resp, err := stream.CloseAndReceive()
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}
