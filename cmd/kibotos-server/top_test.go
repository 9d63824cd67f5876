package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestWsTopRedrawsInATerminal runs `kibotos ws top` of the real binary on a
// terminal: it clears the screen once, then redraws its table in place
// (cursor home, lines cleared) every interval, the CPU column filled from
// the second frame on, until Ctrl-C typed on the terminal ends it, as an
// interrupt (130).
func TestWsTopRedrawsInATerminal(t *testing.T) {
	hosttest.RequireRoot(t)
	d := newDeployment(t, build(t))
	id := d.createWorkspace(false)
	// Before the deployment stops, so that nothing of the workspace stays.
	t.Cleanup(func() { d.cli("ws", "delete", id, "--wait") })

	cmd := exec.Command(d.bin, "ws", "top", id, "--interval", "200ms")
	cmd.Env = append(os.Environ(), "KIBOTOS_HOME="+d.home, "KIBOTOS_ADDR="+d.up.addr, "KIBOTOS_TOKEN=")
	term, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 160, Rows: 24})
	if err != nil {
		t.Fatal(err)
	}
	defer term.Close()
	var screen testutil.SyncBuffer
	go io.Copy(&screen, term)
	frames := func() []string { return strings.Split(screen.String(), "\x1b[H")[1:] }
	for deadline := time.Now().Add(time.Minute); len(frames()) < 3; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("fewer than 3 frames within a minute:\n%q", screen.String())
		}
	}
	if _, err := term.Write([]byte{3}); err != nil { // Ctrl-C
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		// Interrupted, as every command Ctrl-C ends: 128 plus SIGINT.
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 130 {
			t.Errorf("ws top ended with %v after Ctrl-C, want exit status 130:\n%q", err, screen.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("ws top did not end after Ctrl-C:\n%q", screen.String())
	}

	if !strings.HasPrefix(screen.String(), "\x1b[2J\x1b[H") {
		t.Errorf("the view does not start by clearing the screen: %q", screen.String()[:min(40, len(screen.String()))])
	}
	row := regexp.MustCompile(`CPU +CPU TIME +MEMORY +PRESSURE +DISK +VOLUME +NET RX +NET TX +PROCESSES\x1b\[K\r?\n(\S+) +\S+ +\S+/128\.0Mi +\S+ +\S+/\S+Mi +- +\S+ +\S+ +[1-9]\d*\x1b\[K\r?\n`)
	for i, f := range frames()[:3] {
		if !strings.HasPrefix(f, id+"   ") || !strings.Contains(f, "\x1b[J") {
			t.Errorf("frame %d is not a titled full redraw: %q", i, f)
		}
		m := row.FindStringSubmatch(f)
		switch {
		case m == nil:
			t.Errorf("frame %d has no table of the workspace: %q", i, f)
		case i == 0 && m[1] != "-", i > 0 && !regexp.MustCompile(`^\d+\.\d%$`).MatchString(m[1]):
			t.Errorf("frame %d: CPU %q", i, m[1])
		}
	}
}
