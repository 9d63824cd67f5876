// Package logging builds the process's structured logger (log/slog) from
// the --log-format and --log-level flags of `kibotos up` and `kibotos ctrl`.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
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
