// Package logging builds the process's structured logger (log/slog) from
// the --log-format and --log-level flags of `kibotos up` and `kibotos ctrl`.
package logging

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// Formats of New.
const (
	FormatText = "text" // logfmt-like key=value lines
	FormatJSON = "json" // one JSON object per line
)

// New returns a logger writing to w in format (text or json) at level
// (debug, info, warn or error) and above.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case FormatText:
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case FormatJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}

// LineWriter turns what a tool prints into log records: each line is one
// record with message msg at level, the line as "line". Write takes any
// slicing of the output; Close logs a last line without its newline.
type LineWriter struct {
	Logger *slog.Logger // nil is slog.Default()
	Level  slog.Level
	Msg    string

	mu  sync.Mutex
	buf []byte
}

// Write implements io.Writer.
func (w *LineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.log(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

// Close logs what is left.
func (w *LineWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.log(w.buf)
		w.buf = nil
	}
	return nil
}

func (w *LineWriter) log(line []byte) {
	l := w.Logger
	if l == nil {
		l = slog.Default()
	}
	l.Log(context.Background(), w.Level, w.Msg, "line", string(bytes.TrimRight(line, "\r")))
}
