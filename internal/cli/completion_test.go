package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testutil"
)

// complete runs `kibotos __complete args...`, as a shell's completion
// script does, and returns the candidates it printed, without the
// directive line.
func (e *env) complete(t *testing.T, args ...string) []string {
	t.Helper()
	stdout, _, err := e.run(t, "", append([]string{"__complete"}, args...)...)
	if err != nil {
		t.Fatalf("__complete %v: %v", args, err)
	}
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		if line != "" && !strings.HasPrefix(line, ":") {
			out = append(out, line)
		}
	}
	return out
}

func TestCompletionOfIDs(t *testing.T) {
	e := newPlacedEnv(t)
	ws := e.createWorkspace(t)
	id := ws.GetWorkspaceId()
	conn := []string{"--addr", e.addr, "--token", e.token}

	for _, args := range [][]string{
		{"ws", "get", ""},
		{"ws", "exec", "--user", "root", ""},
		{"ws", "network", "get", ""},
		{"ws", "export", ""},
		{"ws", "get", id[:4]},
	} {
		if got := e.complete(t, append(conn, args...)...); !slices.Contains(got, id) {
			t.Errorf("__complete %v = %v, want %s among them", args, got, id)
		}
	}
	if got := e.complete(t, append(conn, "ws", "get", "zzz")...); len(got) != 0 {
		t.Errorf("__complete ws get zzz = %v, want nothing", got)
	}
	if got := e.complete(t, append(conn, "template", "get", "")...); !slices.Contains(got, "base") {
		t.Errorf("__complete template get = %v, want base among them", got)
	}
	// A second argument, and a verb that creates, complete no ID.
	if got := e.complete(t, append(conn, "ws", "get", id, "")...); slices.Contains(got, id) {
		t.Errorf("__complete ws get ID '' = %v", got)
	}
	if got := e.complete(t, append(conn, "template", "create", "")...); slices.Contains(got, "base") {
		t.Errorf("__complete template create = %v", got)
	}

	// The connection comes from a context too.
	e.local(t, "context", "add", "here", "--addr", e.addr, "--token-file", writeFile(t, "token", e.token))
	if got := e.complete(t, "ws", "get", ""); !slices.Contains(got, id) {
		t.Errorf("__complete through the current context = %v", got)
	}
	if got := e.complete(t, "ws", "get", "--context", ""); !slices.Contains(got, "here") {
		t.Errorf("__complete --context = %v, want here", got)
	}
}

// TestCompletionIsQuietOnErrors completes against a server that is not
// there and with a token it refuses: no candidates, no error, nothing on
// stderr.
func TestCompletionIsQuietOnErrors(t *testing.T) {
	e := newEnv(t)
	for _, conn := range [][]string{
		{"--addr", testutil.ClosedURL(t), "--token", "x"},
		{"--addr", e.addr, "--token", "wrong"},
		{"--addr", e.addr}, // no token at all
	} {
		stdout, stderr, err := e.run(t, "", append(append([]string{"__complete"}, conn...), "ws", "get", "")...)
		if err != nil || strings.TrimSpace(stdout) != ":4" || strings.Contains(stderr, "rror") {
			t.Errorf("%v: err %v, stdout %q, stderr %q", conn, err, stdout, stderr)
		}
	}
}

func TestCompletionScripts(t *testing.T) {
	e := newEnv(t)
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if stdout := e.local(t, "completion", shell); !strings.Contains(stdout, "__complete") {
			t.Errorf("completion %s prints no script:\n%.200s", shell, stdout)
		}
	}
}
