package dataplane

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// openPty opens a pseudo-terminal of the size.
func openPty(cols, rows uint16) (master, tty *os.File, err error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, nil, err
	}
	// pty.Open leaves the master in blocking mode (its ioctls call Fd). A
	// non-blocking duplicate is pollable: Close interrupts a Read, and
	// writes honour deadlines.
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	m.Close()
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		tty.Close()
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := pty.Setsize(tty, &pty.Winsize{Cols: cols, Rows: rows}); err != nil {
		master.Close()
		tty.Close()
		return nil, nil, err
	}
	return master, tty, nil
}

// buildEnv merges the guest's environment, the user's identity (HOME,
// USER, LOGNAME, SHELL), defaults (PATH, and TERM on a PTY) and the
// request's env, in that order of precedence from low to high.
func buildEnv(base []string, u *User, extra map[string]string, tty bool) ([]string, error) {
	vals := make(map[string]string)
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, kv := range base {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			set(k, v)
		}
	}
	set("HOME", u.Home)
	set("USER", u.Name)
	set("LOGNAME", u.Name)
	if u.Shell != "" {
		set("SHELL", u.Shell)
	}
	if vals["PATH"] == "" {
		set("PATH", defaultPath)
	}
	if tty && vals["TERM"] == "" {
		set("TERM", "xterm-256color")
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		v := extra[k]
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("invalid name %q", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, fmt.Errorf("%s: value contains a NUL byte", k)
		}
		set(k, v)
	}
	env := make([]string, len(order))
	for i, k := range order {
		env[i] = k + "=" + vals[k]
	}
	return env, nil
}

// envValue returns the value of key in env.
func envValue(env []string, key string) string {
	for _, kv := range slices.Backward(env) {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// lookPath finds the program file as execve would run it: a name with a
// slash is a path (relative to cwd), any other is searched in pathEnv.
func lookPath(file, pathEnv, cwd string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := executable(p); err != nil {
			return "", err
		}
		return p, nil
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, file)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", newError(connect.CodeNotFound, stageStartingProcess, "%s: executable file not found in PATH %q", file, pathEnv)
}

// executable checks that path is a file with an execute bit.
func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return &os.PathError{Op: "exec", Path: path, Err: syscall.EACCES}
	}
	return nil
}
