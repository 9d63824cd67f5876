package guestabi

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestProbeCommands(t *testing.T) {
	for _, tc := range []struct {
		line string
		want ProbeCommand
	}{
		{CommandPing, ProbeCommand{Verb: CommandPing}},
		{StopLine(1500 * time.Millisecond), ProbeCommand{Verb: CommandStop, Grace: 1500 * time.Millisecond}},
		{StopLine(0), ProbeCommand{Verb: CommandStop}},
		{StopLine(-time.Second), ProbeCommand{Verb: CommandStop}}, // sent as 0
		{StopLine(2500 * time.Microsecond), ProbeCommand{Verb: CommandStop, Grace: 2 * time.Millisecond}},
	} {
		got, err := ParseProbeCommand(tc.line)
		if err != nil || got != tc.want {
			t.Errorf("ParseProbeCommand(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
	for _, line := range []string{"", "HELLO", "ping", "STOP", "STOP -1", "STOP abc", "STOP 4294967296", "PING\x00"} {
		if got, err := ParseProbeCommand(line); err == nil {
			t.Errorf("ParseProbeCommand(%q) = %+v, want an error", line, got)
		}
	}
}

func TestProbeAnswer(t *testing.T) {
	for _, tc := range []struct {
		line, want, arg string
		ok              bool
	}{
		{"READY 0123abcd", AnswerReady, "0123abcd", true},
		{"READY", AnswerReady, "", true},
		{"STOPPED", AnswerStopped, "", true},
		{"READYX", AnswerReady, "", false},
		{"ERR unknown command", AnswerReady, "", false},
		{"", AnswerStopped, "", false},
	} {
		arg, ok := ProbeAnswer(tc.line, tc.want)
		if arg != tc.arg || ok != tc.ok {
			t.Errorf("ProbeAnswer(%q, %q) = %q, %v; want %q, %v", tc.line, tc.want, arg, ok, tc.arg, tc.ok)
		}
	}
}

// TestProbeFraming writes lines as either side does and reads them back:
// line ends, the bound of MaxProbeLine and a line cut by the end of input.
func TestProbeFraming(t *testing.T) {
	var buf bytes.Buffer
	for _, line := range []string{CommandPing, StopLine(time.Second), AnswerReady + " id"} {
		if err := WriteProbeLine(&buf, line); err != nil {
			t.Fatal(err)
		}
	}
	buf.WriteString("PING\r\n")
	buf.WriteString(strings.Repeat("A", MaxProbeLine-1) + "\n") // exactly the bound
	r := NewProbeReader(&buf)
	for _, want := range []string{"PING", "STOP 1000", "READY id", "PING", strings.Repeat("A", MaxProbeLine-1)} {
		if got, err := r.ReadLine(); err != nil || got != want {
			t.Fatalf("ReadLine = %.20q, %v; want %.20q", got, err, want)
		}
	}
	if _, err := r.ReadLine(); err != io.EOF {
		t.Fatalf("at the end: %v, want io.EOF", err)
	}

	long := NewProbeReader(strings.NewReader(strings.Repeat("A", MaxProbeLine) + "\n"))
	if _, err := long.ReadLine(); !errors.Is(err, ErrProbeLineTooLong) {
		t.Fatalf("a line over the bound: %v, want ErrProbeLineTooLong", err)
	}
	cut := NewProbeReader(strings.NewReader("READY 01"))
	if _, err := cut.ReadLine(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a cut line: %v, want io.ErrUnexpectedEOF", err)
	}
}
