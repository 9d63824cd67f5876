package guestabi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// The probe protocol, spoken on SocketDir/ProbeSocket: the host sends one
// command per line and reads one answer line.
//
//	PING            -> READY <boot-id>
//	STOP <grace-ms> -> STOPPED   (processes ended and synced; the agent exits)
//	anything else   -> ERR <reason>
//
// A line ends in "\n" (a "\r" before it is ignored) and is at most
// MaxProbeLine bytes long, its end included.
const (
	CommandPing = "PING"
	CommandStop = "STOP"

	AnswerReady   = "READY"
	AnswerStopped = "STOPPED"
	AnswerError   = "ERR"

	MaxProbeLine = 4096
)

// ErrProbeLineTooLong is what ReadLine returns for a line longer than
// MaxProbeLine.
var ErrProbeLineTooLong = errors.New("line too long")

// ProbeCommand is one parsed command line.
type ProbeCommand struct {
	// Verb is CommandPing or CommandStop.
	Verb string
	// Grace is the grace of a STOP.
	Grace time.Duration
}

// StopLine returns the command line (without its end) asking the agent
// to stop within grace, which is sent in whole milliseconds.
func StopLine(grace time.Duration) string {
	return CommandStop + " " + strconv.FormatInt(max(grace.Milliseconds(), 0), 10)
}

// ParseProbeCommand parses a command line without its end. The error's
// text is the reason an ERR answer gives.
func ParseProbeCommand(line string) (ProbeCommand, error) {
	verb, arg, _ := strings.Cut(line, " ")
	switch verb {
	case CommandPing:
		return ProbeCommand{Verb: verb}, nil
	case CommandStop:
		ms, err := strconv.ParseUint(arg, 10, 32)
		if err != nil {
			return ProbeCommand{}, fmt.Errorf("bad grace %q", arg)
		}
		return ProbeCommand{Verb: verb, Grace: time.Duration(ms) * time.Millisecond}, nil
	}
	return ProbeCommand{}, fmt.Errorf("unknown command %q", verb)
}

// ProbeAnswer checks that an answer line (without its end) is want, alone
// or followed by a space and an argument, and returns the argument.
func ProbeAnswer(line, want string) (arg string, ok bool) {
	if line == want {
		return "", true
	}
	if arg, ok := strings.CutPrefix(line, want+" "); ok {
		return arg, true
	}
	return "", false
}

// ProbeReader reads the lines of the probe protocol.
type ProbeReader struct {
	r *bufio.Reader
}

// NewProbeReader returns a ProbeReader that reads from r.
func NewProbeReader(r io.Reader) *ProbeReader {
	return &ProbeReader{r: bufio.NewReaderSize(r, MaxProbeLine)}
}

// ReadLine returns the next line without its end. A line cut by the end
// of input is an error (io.ErrUnexpectedEOF, or io.EOF when nothing of it
// came), one longer than MaxProbeLine is ErrProbeLineTooLong.
func (p *ProbeReader) ReadLine() (string, error) {
	line, err := p.r.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return "", ErrProbeLineTooLong
	case errors.Is(err, io.EOF) && len(line) > 0:
		return "", io.ErrUnexpectedEOF
	case err != nil:
		return "", err
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r"), nil
}

// WriteProbeLine writes line and its end.
func WriteProbeLine(w io.Writer, line string) error {
	_, err := io.WriteString(w, line+"\n")
	return err
}
