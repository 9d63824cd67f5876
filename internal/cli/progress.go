package cli

import (
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"
)

// statusLine writes progress to stderr. On a terminal, update rewrites one
// line in place with \r; elsewhere (a pipe, a log) update does nothing and
// only whole lines are written, so that logs stay readable.
type statusLine struct {
	w     io.Writer
	tty   bool
	width int // characters of the line shown in place; 0 when none
}

func newStatusLine(w io.Writer) *statusLine {
	return &statusLine{w: w, tty: isTerminal(w)}
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// update shows text in place of the previous update, on a terminal only.
func (s *statusLine) update(text string) {
	if !s.tty {
		return
	}
	n := utf8.RuneCountInString(text)
	fmt.Fprintf(s.w, "\r%s%s", text, strings.Repeat(" ", max(s.width-n, 0)))
	s.width = n
}

// println ends the line in place, if any, and writes text as a line.
func (s *statusLine) println(text string) {
	s.end()
	fmt.Fprintln(s.w, text)
}

// end moves past the line shown in place, if any, keeping it visible.
func (s *statusLine) end() {
	if s.width > 0 {
		fmt.Fprintln(s.w)
		s.width = 0
	}
}

// progressBar draws `uploading [=====>      ] 12.3 MiB / 40.0 MiB (30%)`.
func progressBar(verb string, done, total uint64) string {
	const width = 30
	n := percent(done, total) * width / 100
	bar := strings.Repeat("=", n)
	if n < width {
		bar += ">" + strings.Repeat(" ", width-n-1)
	}
	return fmt.Sprintf("%s [%s] %s", verb, bar, byteProgress(done, total))
}

// rowWriter prints table rows one at a time as they arrive, which a
// tabwriter cannot: it aligns only what it buffers. The columns take the
// widths of the header and the first row, and widen when a later cell does
// not fit.
type rowWriter struct {
	w      io.Writer
	header []string
	widths []int // nil until the first row
}

func (r *rowWriter) write(cells []string) error {
	if r.widths == nil {
		r.widths = make([]int, len(r.header))
		r.fit(r.header)
		r.fit(cells)
		if err := r.line(r.header); err != nil {
			return err
		}
	}
	r.fit(cells)
	return r.line(cells)
}

func (r *rowWriter) fit(cells []string) {
	for i, c := range cells {
		if i < len(r.widths) {
			r.widths[i] = max(r.widths[i], utf8.RuneCountInString(c))
		}
	}
}

func (r *rowWriter) line(cells []string) error {
	var b strings.Builder
	for i, c := range cells {
		b.WriteString(c)
		if i < len(cells)-1 {
			b.WriteString(strings.Repeat(" ", r.widths[i]-utf8.RuneCountInString(c)+3))
		}
	}
	b.WriteByte('\n')
	_, err := io.WriteString(r.w, b.String())
	return err
}
