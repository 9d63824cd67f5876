package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/sdk"
)

// newDataEnv returns an env on the package's deployment and the ID of an
// AVAILABLE workspace of the test's own, whose guest serves the data
// plane.
func newDataEnv(t *testing.T) (*env, string) {
	t.Helper()
	e := newUpEnv(t)
	return e, e.createWorkspace(t, append([]string{"--wait"}, smallWorkspace...)...).GetWorkspaceId()
}

// runData runs `kibotos args...` with the env's address and token.
func (e *env) runData(t testing.TB, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return e.run(t, stdin, append([]string{args[0], args[1], "--addr", e.addr, "--token", e.token}, args[2:]...)...)
}

// sh runs a shell command in the workspace and wants success.
func (e *env) sh(t *testing.T, id, script string) string {
	t.Helper()
	stdout, stderr, err := e.runData(t, "", "ws", "exec", id, "--", "sh", "-c", script)
	if err != nil {
		t.Fatalf("sh -c %q: %v\nstderr: %s", script, err, stderr)
	}
	return stdout
}

func TestExecPropagatesExitCode(t *testing.T) {
	e, id := newDataEnv(t)
	for _, tc := range []struct {
		end  string
		want int
	}{
		{"exit 1", 1},
		{"exit 7", 7},
		{"kill -KILL $$", 137},
		{"kill -TERM $$", 143},
	} {
		t.Run(tc.end, func(t *testing.T) {
			stdout, stderr, err := e.runData(t, "", "ws", "exec", id, "--", "sh", "-c", "printf out:; printf err >&2; "+tc.end)
			var exit *ExitError
			if !errors.As(err, &exit) || exit.Code != tc.want {
				t.Fatalf("err = %v, want exit status %d", err, tc.want)
			}
			if stdout != "out:" || stderr != "err" {
				t.Errorf("stdout %q, stderr %q", stdout, stderr)
			}
		})
	}
}

func TestExecSendsOptionsAndStdin(t *testing.T) {
	e, id := newDataEnv(t)
	stdout, _, err := e.runData(t, "hello\nworld\n", "ws", "exec", "-i", "--user", "root", "--cwd", "/tmp", "--env", "A=1", "--env", "B=x=y",
		id, "--", "sh", "-c", `cat -; echo "$A $B"; pwd; id -u; [ -t 0 ] || echo no-tty`)
	if err != nil {
		t.Fatal(err)
	}
	if want := "hello\nworld\n1 x=y\n/tmp\n0\nno-tty\n"; stdout != want {
		t.Errorf("stdout = %q, want %q", stdout, want)
	}
}

func TestExecTTYAsksForPTY(t *testing.T) {
	e, id := newDataEnv(t)
	t.Setenv("TERM", "vt100")
	stdout, _, err := e.runData(t, "", "ws", "exec", "-t", id, "--", "sh", "-c", `echo "$TERM"; stty size; [ -t 0 ] && echo tty; exit 3`)
	var exit *ExitError
	if !errors.As(err, &exit) || exit.Code != 3 {
		t.Fatalf("err = %v, want exit status 3", err)
	}
	want := fmt.Sprintf("vt100\r\n%d %d\r\ntty\r\n", defaultPTY.Rows, defaultPTY.Cols)
	if stdout != want {
		t.Errorf("stdout = %q, want %q (TERM from here, the default size, a terminal)", stdout, want)
	}
}

func TestExecUnknownWorkspace(t *testing.T) {
	e, _ := newDataEnv(t)
	_, _, err := e.runData(t, "", "ws", "exec", "ws_06h38fjb8dr6d00n3d7fkxjf2m", "true")
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("err = %v, want not_found", err)
	}
}

func TestCpUpload(t *testing.T) {
	e, id := newDataEnv(t)
	local := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(local, []byte("some notes"), 0o640); err != nil {
		t.Fatal(err)
	}
	e.sh(t, id, "mkdir /work")
	for _, tc := range []struct{ src, dst, path, data string }{
		{local, id + ":/work/a.txt", "/work/a.txt", "some notes"},
		{local, id + ":/work", "/work/notes.txt", "some notes"},
		{"-", id + ":/work/in", "/work/in", "from stdin"},
	} {
		if _, _, err := e.runData(t, "from stdin", "ws", "cp", tc.src, tc.dst); err != nil {
			t.Fatalf("cp %s %s: %v", tc.src, tc.dst, err)
		}
		if got := e.sh(t, id, "cat "+tc.path); got != tc.data {
			t.Errorf("cp %s %s: %s holds %q, want %q", tc.src, tc.dst, tc.path, got, tc.data)
		}
	}
	// A file keeps its mode; stdin has none and gets the default.
	if got := e.sh(t, id, "stat -c %a /work/a.txt /work/in"); got != "640\n644\n" {
		t.Errorf("modes = %q, want 640 and the default 644", got)
	}
}

func TestCpDownload(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, "mkdir /work && printf 0123456789 > /work/out.bin && chmod 750 /work/out.bin && ln -s /work/out.bin /work/link")
	dir := t.TempDir()
	if _, _, err := e.runData(t, "", "ws", "cp", id+":/work/out.bin", dir); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "out.bin")
	got, err := os.ReadFile(path)
	if err != nil || string(got) != "0123456789" {
		t.Errorf("%s = %q, %v", path, got, err)
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o750 {
		t.Errorf("mode = %v, want the remote 0750", st.Mode())
	}

	stdout, _, err := e.runData(t, "", "ws", "cp", id+":/work/out.bin", "-")
	if err != nil || stdout != "0123456789" {
		t.Errorf("cp to stdout = %q, %v", stdout, err)
	}

	// A symlink is copied as the file it leads to, with that file's mode.
	if _, _, err := e.runData(t, "", "ws", "cp", id+":/work/link", dir); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if got, err := os.ReadFile(link); err != nil || string(got) != "0123456789" {
		t.Errorf("%s = %q, %v", link, got, err)
	}
	if st, _ := os.Stat(link); st.Mode().Perm() != 0o750 {
		t.Errorf("the symlink's copy: mode %v, want its target's 0750", st.Mode())
	}
	os.Remove(link)

	// Onto an existing file it keeps that file's mode; through a local
	// link it writes the link's target, and the link stays.
	ro := filepath.Join(dir, "ro")
	if err := os.WriteFile(ro, []byte("old"), 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("ro", filepath.Join(dir, "to-ro")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.runData(t, "", "ws", "cp", id+":/work/out.bin", filepath.Join(dir, "to-ro")); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(ro); err != nil || string(got) != "0123456789" {
		t.Errorf("the link's target after a copy through it: %q, %v", got, err)
	}
	if st, err := os.Lstat(filepath.Join(dir, "to-ro")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the local link after a copy through it: %v, %v", st, err)
	}
	if st, _ := os.Stat(ro); st.Mode().Perm() != 0o444 {
		t.Errorf("the existing file's mode after a copy onto it: %v, want its 0444", st.Mode())
	}
	os.Remove(ro)
	os.Remove(filepath.Join(dir, "to-ro"))
	// A directory that is not there is named as asked for.
	if _, _, err := e.runData(t, "", "ws", "cp", id+":/work/out.bin", filepath.Join(dir, "nodir", "x")); err == nil ||
		!strings.Contains(err.Error(), filepath.Join(dir, "nodir", "x")) {
		t.Errorf("a copy into a directory that is not there: %v, want an error naming %s", err, filepath.Join(dir, "nodir", "x"))
	}

	// A failed copy leaves no file behind.
	_, _, err = e.runData(t, "", "ws", "cp", id+":/work/missing", filepath.Join(dir, "m"))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("err = %v, want not_found", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%s holds %d entries, want out.bin alone", dir, len(entries))
	}
}

func TestCpRejectsOperands(t *testing.T) {
	e := newEnv(t)
	for _, args := range [][]string{
		{"a", "b"},
		{"ws_1:/a", "ws_1:/b"},
		{"a", "ws_1:"},
		{"-", "ws_1:/work"},
	} {
		if _, _, err := e.runData(t, "", append([]string{"ws", "cp"}, args...)...); err == nil {
			t.Errorf("cp %v succeeded", args)
		}
	}
	if op, _ := parseCpOperand("./a:b"); op.ws != "" {
		t.Errorf("./a:b read as workspace %q", op.ws)
	}
}

// processes lists the workspace's processes.
func (e *env) processes(t *testing.T, id string) []*datav1.ProcessInfo {
	t.Helper()
	stdout, _, err := e.runData(t, "", "ws", "ps", id, "-o", "json")
	var resp datav1.ListProcessesResponse
	if err != nil || protojson.Unmarshal([]byte(stdout), &resp) != nil {
		t.Fatalf("ps -o json = %s, %v", stdout, err)
	}
	return resp.GetProcesses()
}

func TestPs(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, "exit 0")
	if _, _, err := e.runData(t, "", "ws", "exec", id, "--", "sh", "-c", "exit 2"); err == nil {
		t.Fatal("exit 2 succeeded")
	}
	procs := e.processes(t, id)
	if len(procs) != 2 {
		t.Fatalf("%d processes, want 2: %v", len(procs), procs)
	}
	stdout, _, err := e.runData(t, "", "ws", "ps", id)
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	for _, l := range strings.Split(strings.TrimRight(stdout, "\n"), "\n") {
		rows = append(rows, strings.Join(strings.Fields(l), " "))
	}
	want := []string{"PID TAG USER PTY AGE EXIT COMMAND"}
	for i, exit := range []string{"0", "2"} {
		p := procs[i]
		want = append(want, fmt.Sprintf("%d - %s false %s %s sh -c exit %s", p.GetPid(), cmp.Or(p.GetUser(), "-"), age(p.GetStartedAt()), exit, exit))
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("ps:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
}

func TestLogs(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, "echo buffered")
	pid := e.processes(t, id)[0].GetPid()
	// An ended process: its buffered output, then the exit.
	stdout, _, err := e.runData(t, "", "ws", "logs", id, fmt.Sprint(pid))
	if err != nil || stdout != "buffered\n" {
		t.Errorf("logs %d = %q, %v", pid, stdout, err)
	}
	_, _, err = e.runData(t, "", "ws", "logs", id, "nope", "-f")
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("logs nope = %v, want not_found", err)
	}
	// -f exits with the process's exit code, as exec does.
	if _, _, err := e.runData(t, "", "ws", "exec", "--tag", "three", id, "--", "sh", "-c", "echo x; exit 3"); err == nil {
		t.Fatal("exit 3 succeeded")
	}
	if _, _, err := e.runData(t, "", "ws", "logs", id, "three", "-f"); !errors.As(err, new(*ExitError)) || err.(*ExitError).Code != 3 {
		t.Errorf("logs -f of a process that exited 3: %v, want exit 3", err)
	}
	// Interrupted while the process runs: canceled, which Main reports as
	// the signal (exit 128 plus it), not as the process's success.
	if _, _, err := e.runData(t, "", "ws", "exec", "--detach", "--tag", "long", id, "--", "sleep", "300"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	time.AfterFunc(500*time.Millisecond, func() { cancel(interrupted{syscall.SIGTERM}) })
	if _, _, err := e.runIn(ctx, t, "", "ws", "logs", "--addr", e.addr, "--token", e.token, id, "long", "-f"); !errors.Is(err, context.Canceled) {
		t.Errorf("logs -f interrupted while the process runs: %v, want context.Canceled", err)
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		s    sdk.ExitStatus
		want int
	}{
		{sdk.ExitStatus{}, 0},
		{sdk.ExitStatus{Code: 42}, 42},
		{sdk.ExitStatus{Signal: "SIGINT"}, 130},
		{sdk.ExitStatus{Signal: "kill"}, 137},
		{sdk.ExitStatus{Signal: "SIGBOGUS"}, 255},
		{sdk.ExitStatus{Signal: "SIG34"}, 162}, // a real-time signal, named by its number
		{sdk.ExitStatus{Signal: "SIG99"}, 255},
	} {
		if got := exitCode(tc.s); got != tc.want {
			t.Errorf("exitCode(%v) = %d, want %d", tc.s, got, tc.want)
		}
	}
}

// TestExecReusesCachedSession runs ws exec again and again: the first
// keeps its session in the cache (0600), the next ones use it as it is and
// leave its file alone, a session the data plane refuses is replaced in
// the file, another project's token does not get to use it, and with the
// cache off nothing is written.
func TestExecReusesCachedSession(t *testing.T) {
	e, id := newDataEnv(t)
	dir := os.Getenv(envSessionCache)
	cached := func() (string, cachedSession) {
		t.Helper()
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		if len(files) != 1 {
			t.Fatalf("session cache holds %v, want one file", files)
		}
		fi, err := os.Stat(files[0])
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("cache file %s: %v, %v; want mode 0600", files[0], fi.Mode(), err)
		}
		b, err := os.ReadFile(files[0])
		var s cachedSession
		if err == nil {
			err = json.Unmarshal(b, &s)
		}
		if err != nil || s.Token == "" {
			t.Fatalf("cache file %s: %q %v", files[0], b, err)
		}
		return files[0], s
	}
	e.sh(t, id, "true")
	path, first := cached()
	written, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if out := e.sh(t, id, "echo again"); out != "again\n" {
		t.Fatalf("second exec: %q", out)
	}
	if _, s := cached(); s.ID != first.ID {
		t.Errorf("second exec left session %s, want the cached %s", s.ID, first.ID)
	}
	// A store replaces the file by a rename, so the same file is one that
	// was not written again.
	if again, err := os.Stat(path); err != nil || !os.SameFile(written, again) {
		t.Errorf("the second exec wrote the cached session again (%v)", err)
	}

	// A session the data plane refuses gives way to a new one.
	bogus := first
	mac := strings.LastIndexByte(first.Token, '.') + 1 // a MAC that does not verify
	c := "A"
	if first.Token[mac] == 'A' {
		c = "B"
	}
	bogus.Token = first.Token[:mac] + c + first.Token[mac+1:]
	b, _ := json.Marshal(bogus)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if out := e.sh(t, id, "echo renewed"); out != "renewed\n" {
		t.Fatalf("exec with a refused session: %q", out)
	}
	if _, s := cached(); s.ID == first.ID || s.Token == bogus.Token {
		t.Errorf("after a refusal the cache holds session %s, want a new one", s.ID)
	}

	// The token of another project, which may not reach the workspace,
	// gets nothing from the cached session.
	other := uptest.Shared(t).Project(t)
	_, _, err = e.run(t, "", "ws", "exec", "--addr", e.addr, "--token", other, id, "--", "true")
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("exec with another project's token: %v, want not_found", err)
	}
	cached()

	t.Setenv(envSessionCache, "off")
	os.RemoveAll(dir)
	e.sh(t, id, "true")
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("with the cache off, %s: %v", dir, err)
	}
}

// --detach leaves the command running and prints its pid; --timeout kills
// a command that runs longer.
func TestExecDetachAndTimeout(t *testing.T) {
	e, id := newDataEnv(t)
	stdout, stderr, err := e.runData(t, "", "ws", "exec", "--detach", "--tag", "bg", id, "--", "sleep", "1000")
	if err != nil {
		t.Fatalf("exec --detach: %v\n%s", err, stderr)
	}
	pid := strings.TrimSpace(stdout)
	if got := e.sh(t, id, "cat /proc/"+pid+"/comm"); got != "sleep\n" {
		t.Errorf("the detached process %s runs %q", pid, got)
	}

	_, stderr, err = e.runData(t, "", "ws", "exec", "--timeout", "1s", "--tag", "slow", id, "--", "sleep", "1000")
	if exit := (*ExitError)(nil); !errors.As(err, &exit) || exit.Code != 137 || !strings.Contains(stderr, "timed out after 1s; killing pid") {
		t.Fatalf("exec --timeout: %v, %s; want exit 137 and why", err, stderr)
	}
	// The kill is sent; the exit is reaped a moment later.
	killed := false
	var procs []*datav1.ProcessInfo
	for try := 0; !killed && try < 100; try++ {
		ps, _, err := e.runData(t, "", "ws", "ps", id, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var resp datav1.ListProcessesResponse
		if err := protojson.Unmarshal([]byte(ps), &resp); err != nil {
			t.Fatal(err)
		}
		procs = resp.GetProcesses()
		for _, p := range procs {
			killed = killed || (p.GetTag() == "slow" && p.GetExited().GetSignal() == "SIGKILL")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !killed {
		t.Errorf("no process tagged slow ended by SIGKILL: %v", procs)
	}

	for _, args := range [][]string{{"--detach", "-i"}, {"--detach", "--timeout", "1s"}, {"--timeout", "-1s"}} {
		if _, _, err := e.runData(t, "", append(append([]string{"ws", "exec"}, args...), id, "--", "true")...); err == nil {
			t.Errorf("exec %v succeeded", args)
		}
	}
}

// TestExecInterruptWaitsForTheExit interrupts `ws exec` (its context ends,
// as on Ctrl-C): the command gets SIGTERM, and exec prints what it
// printed on its way out and exits with its code.
func TestExecInterruptWaitsForTheExit(t *testing.T) {
	e, id := newDataEnv(t)
	// Each script marks /tmp/TAG once its trap is set: an interrupt
	// before that would kill it without last words.
	for tag, script := range map[string]string{
		"trapper": `trap 'echo got TERM; exit 7' TERM; touch /tmp/trapper; while :; do sleep 0.1; done`,
		// A command that stopped itself gets the TERM too.
		"stopped": `trap 'echo got TERM; exit 7' TERM; touch /tmp/stopped; kill -STOP $$; while :; do sleep 0.1; done`,
		// A hangup here is one there.
		"hangup": `trap 'echo got TERM; exit 7' HUP; touch /tmp/hangup; while :; do sleep 0.1; done`,
	} {
		ctx, cancel := context.WithCancelCause(t.Context())
		interrupt := func() { cancel(interrupted{syscall.SIGTERM}) }
		if tag == "hangup" {
			interrupt = func() { cancel(interrupted{syscall.SIGHUP}) }
		}
		type result struct {
			stdout, stderr string
			err            error
		}
		done := make(chan result, 1)
		go func() {
			stdout, stderr, err := e.runIn(ctx, t, "", "ws", "exec", "--addr", e.addr, "--token", e.token, "--tag", tag, id, "--", "sh", "-c", script)
			done <- result{stdout, stderr, err}
		}()
		e.sh(t, id, "for i in $(seq 600); do [ -e /tmp/"+tag+" ] && exit 0; sleep 0.05; done; exit 1")
		if tag == "stopped" {
			e.sh(t, id, "sleep 0.2") // until it has stopped itself
		}
		interrupt()
		select {
		case r := <-done:
			sent := map[bool]string{true: "SIGHUP", false: "SIGTERM"}[tag == "hangup"]
			if exit := (*ExitError)(nil); !errors.As(r.err, &exit) || exit.Code != 7 || r.stdout != "got TERM\n" ||
				!strings.Contains(r.stderr, "interrupted; sending "+sent+" to pid") {
				t.Errorf("%s: interrupted exec: %v, stdout %q, stderr %q; want exit 7 after the command's last words", tag, r.err, r.stdout, r.stderr)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: interrupted exec does not end", tag)
		}
	}
}

// TestExecOfWhatCannotRun: a program that is not there exits 127, one
// that may not be run 126, as in a shell, saying why.
func TestExecOfWhatCannotRun(t *testing.T) {
	e, id := newDataEnv(t)
	for _, c := range []struct {
		program string
		code    int
	}{{"no-such-program", 127}, {"/etc/hostname", 126}} {
		_, stderr, err := e.runData(t, "", "ws", "exec", id, "--", c.program)
		if exit := (*ExitError)(nil); !errors.As(err, &exit) || exit.Code != c.code || !strings.Contains(stderr, c.program) {
			t.Errorf("exec %s: %v, %q; want exit %d saying why", c.program, err, stderr, c.code)
		}
	}
	// A working directory that is not there is not a program not found.
	_, _, err := e.runData(t, "", "ws", "exec", "--cwd", "/no/such/dir", id, "--", "pwd")
	if err == nil || errors.As(err, new(*ExitError)) || !strings.Contains(err.Error(), "cwd /no/such/dir") {
		t.Errorf("exec with a missing --cwd: %v, want an error naming the cwd, not an exit code", err)
	}
}

// TestExecWhoseReaderLeft: when exec's output can no longer be written
// (its reader left, as `| head` leaves), the command gets SIGPIPE, as a
// local command in that pipe would, instead of running on unread, and
// exec exits 141.
func TestExecWhoseReaderLeft(t *testing.T) {
	e, id := newDataEnv(t)
	for _, c := range []struct {
		command []string
		endsOf  string
	}{
		{[]string{"yes"}, "SIGPIPE"},
		// One that ignores SIGPIPE gets SIGTERM after a grace.
		{[]string{"sh", "-c", "trap '' PIPE; yes"}, "SIGTERM"},
	} {
		root := &cobra.Command{Use: "kibotos", SilenceErrors: true, SilenceUsage: true}
		root.AddCommand(Commands()...)
		root.SetArgs(append([]string{"ws", "exec", "--addr", e.addr, "--token", e.token, "--tag", c.endsOf, id, "--"}, c.command...))
		root.SetOut(&brokenPipe{})
		root.SetErr(&bytes.Buffer{})
		root.SetIn(strings.NewReader(""))
		if err := root.ExecuteContext(t.Context()); !errors.As(err, new(*ExitError)) || err.(*ExitError).Code != 141 {
			t.Errorf("exec of %v whose reader left: %v, want exit 141", c.command, err)
		}
		for try := 0; ; try++ {
			ps, _, err := e.runData(t, "", "ws", "ps", id, "-o", "json")
			var list datav1.ListProcessesResponse
			if err == nil && protojson.Unmarshal([]byte(ps), &list) == nil && slices.ContainsFunc(list.Processes, func(p *datav1.ProcessInfo) bool {
				return p.GetTag() == c.endsOf && p.GetExited().GetSignal() == c.endsOf
			}) {
				break
			}
			if try == 100 {
				t.Fatalf("%v did not end of %s after its reader left: %s", c.command, c.endsOf, ps)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// brokenPipe takes one write and then fails as a pipe whose reader left.
type brokenPipe struct{ wrote bool }

func (b *brokenPipe) Write(p []byte) (int, error) {
	if b.wrote {
		return 0, &os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.EPIPE}
	}
	b.wrote = true
	return len(p), nil
}

// TestExecStdinReadLate: `ws exec -i` of a command that reads its stdin
// only after longer than a call may take gets all of it: sending input
// waits for the command, as a pipe does, outside the call timeout.
func TestExecStdinReadLate(t *testing.T) {
	e, id := newDataEnv(t)
	defer func(d time.Duration) { callTimeout = d }(callTimeout)
	callTimeout = time.Second
	type result struct {
		stdout string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		stdout, _, err := e.runData(t, strings.Repeat("x", 1<<20), "ws", "exec", "-i", id, "--", "sh", "-c", "sleep 3; wc -c")
		done <- result{stdout, err}
	}()
	select {
	case r := <-done:
		if r.err != nil || strings.TrimSpace(r.stdout) != "1048576" {
			t.Errorf("a command reading 1 MiB of stdin after 3 s: %q, %v; want all of it", r.stdout, r.err)
		}
	case <-time.After(time.Minute):
		t.Fatal("ws exec -i of a command that reads late hangs")
	}
}

// TestMayRunOn: an exec whose connection broke says its command may run
// on and how to follow it, rather than only to retry; other errors stay.
func TestMayRunOn(t *testing.T) {
	cut := connect.NewError(connect.CodeUnavailable, errors.New("the connection to the server broke during the call; retry"))
	if err := mayRunOn(cut, "ws_1", 42); connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "kibotos ws logs -f ws_1 42") {
		t.Errorf("a cut exec: %v", err)
	}
	other := connect.NewError(connect.CodeNotFound, errors.New("no such workspace"))
	if err := mayRunOn(other, "ws_1", 42); err != other {
		t.Errorf("another error: %v", err)
	}
}
