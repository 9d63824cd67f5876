// Package mountinfo reads this process's mount table,
// /proc/self/mountinfo, a line at a time, and picks fields out of a line
// without decoding the rest: a host running a thousand workspaces has
// thousands of mounts, and most lines are only compared.
//
// Paths in the table are escaped as the kernel writes them (space, tab,
// newline and backslash as three octal digits). Escape a path to compare
// it with a field; Unescape a field to use it.
package mountinfo

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Scan calls each with every line of this mount namespace's table; the
// line is valid only during the call.
func Scan(each func(line []byte)) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		each(sc.Bytes())
	}
	return sc.Err()
}

// MountPoint returns the mount point, the fifth field, of a line, still
// escaped.
func MountPoint(line []byte) ([]byte, bool) {
	for range 4 {
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			return nil, false
		}
		line = line[i+1:]
	}
	if i := bytes.IndexByte(line, ' '); i >= 0 {
		line = line[:i]
	}
	return line, len(line) > 0
}

// Source returns the mount's source, the second field after the optional
// fields' separator (" - "), still escaped.
func Source(line []byte) ([]byte, bool) {
	_, after, ok := bytes.Cut(line, []byte(" - "))
	if !ok {
		return nil, false
	}
	f := bytes.Fields(after)
	if len(f) < 2 {
		return nil, false
	}
	return f[1], true
}

// Escape escapes a path as the table does.
func Escape(s string) string {
	if !strings.ContainsAny(s, " \t\n\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\\':
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Unescape decodes the octal escapes (\040 for a space, ...) of a path
// in the table.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
