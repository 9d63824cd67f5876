package logging_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/logging"
)

// JSON logs are one object per line, at the level asked and above.
func TestJSON(t *testing.T) {
	var buf bytes.Buffer
	l, err := logging.New(&buf, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("dropped")
	l.Warn("kept", "request_id", "abc", "n", 3)
	l.Error("also kept")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2: %q", len(lines), buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	if m["msg"] != "kept" || m["level"] != "WARN" || m["request_id"] != "abc" || m["n"] != 3.0 || m["time"] == nil {
		t.Errorf("line = %v", m)
	}
}

func TestText(t *testing.T) {
	var buf bytes.Buffer
	l, err := logging.New(&buf, "text", "debug")
	if err != nil {
		t.Fatal(err)
	}
	l.Debug("hello", "k", "v")
	if !strings.Contains(buf.String(), "level=DEBUG msg=hello k=v") {
		t.Errorf("text line = %q", buf.String())
	}
}

func TestRefusals(t *testing.T) {
	for _, c := range [][2]string{{"xml", "info"}, {"json", "loud"}, {"", "info"}} {
		if _, err := logging.New(&bytes.Buffer{}, c[0], c[1]); err == nil {
			t.Errorf("New(%q, %q) took it", c[0], c[1])
		}
	}
}

// A tool's output becomes one record per line, however it is written.
func TestLineWriter(t *testing.T) {
	var buf bytes.Buffer
	l, err := logging.New(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	w := &logging.LineWriter{Logger: l, Level: slog.LevelInfo, Msg: "tool"}
	for _, part := range []string{"fir", "st\nsecond\r\nthi", "rd"} {
		w.Write([]byte(part))
	}
	w.Close()
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["msg"] != "tool" {
			t.Fatalf("record %q: %v", line, err)
		}
		got = append(got, m["line"].(string))
	}
	if strings.Join(got, "|") != "first|second|third" {
		t.Errorf("lines = %q", got)
	}
}
