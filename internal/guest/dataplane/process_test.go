package dataplane

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
)

// run collects the events of a process stream until it ends.
type run struct {
	pid            int32
	stdout, stderr bytes.Buffer
	pty            bytes.Buffer
	exited         *datav1.ProcessEvent_Exited
	order          []string // kinds of the events, in order
}

func collect(t *testing.T, stream *connect.ServerStreamForClient[datav1.ProcessEvent]) *run {
	t.Helper()
	r := &run{}
	for stream.Receive() {
		r.add(t, stream.Msg())
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return r
}

func (r *run) add(t *testing.T, ev *datav1.ProcessEvent) {
	t.Helper()
	if r.exited != nil {
		t.Fatalf("event after exited: %v", ev)
	}
	switch e := ev.Event.(type) {
	case *datav1.ProcessEvent_Started_:
		if len(r.order) != 0 {
			t.Fatalf("started not first: %v", r.order)
		}
		r.pid = e.Started.GetPid()
		r.order = append(r.order, "started")
	case *datav1.ProcessEvent_Stdout:
		r.stdout.Write(e.Stdout)
		r.order = append(r.order, "stdout")
	case *datav1.ProcessEvent_Stderr:
		r.stderr.Write(e.Stderr)
		r.order = append(r.order, "stderr")
	case *datav1.ProcessEvent_Pty:
		r.pty.Write(e.Pty)
		r.order = append(r.order, "pty")
	case *datav1.ProcessEvent_Exited_:
		r.exited = e.Exited
		r.order = append(r.order, "exited")
	default:
		t.Fatalf("unknown event %v", ev)
	}
}

// waitFor receives events until cond holds.
func (r *run) waitFor(t *testing.T, stream *connect.ServerStreamForClient[datav1.ProcessEvent], what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if !stream.Receive() {
			t.Fatalf("stream ended (%v) waiting for %s; stdout %q stderr %q pty %q", stream.Err(), what, r.stdout.String(), r.stderr.String(), r.pty.String())
		}
		r.add(t, stream.Msg())
	}
}

func TestExitCode(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-c", "echo out; echo err >&2; exit 3"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, stream)
	if r.pid <= 0 || r.stdout.String() != "out\n" || r.stderr.String() != "err\n" {
		t.Fatalf("pid %d stdout %q stderr %q", r.pid, r.stdout.String(), r.stderr.String())
	}
	if r.exited.GetExitCode() != 3 || r.exited.GetSignal() != "" {
		t.Fatalf("exited %v, want code 3", r.exited)
	}
	if r.order[0] != "started" || r.order[len(r.order)-1] != "exited" {
		t.Fatalf("order %v", r.order)
	}
}

func TestEnvCwdUser(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-c", `echo "$FOO|$HOME|$USER|$(id -u)|$(id -g)|$(pwd)"`},
		Env:  map[string]string{"FOO": "bar"},
		User: "nobody",
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, stream)
	// nobody's home, /nonexistent, does not exist: the cwd is then /.
	if got, want := r.stdout.String(), "bar|/nonexistent|nobody|65534|65534|/\n"; got != want {
		t.Fatalf("got %q, want %q (stderr %q)", got, want, r.stderr.String())
	}
	// An explicit cwd; root's home by default.
	stream, err = e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"pwd"}, Cwd: "/tmp",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if r := collect(t, stream); r.stdout.String() != "/tmp\n" {
		t.Fatalf("pwd in /tmp: %q", r.stdout.String())
	}
}

func TestSignalExit(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sleep", "100"}, Tag: "sleeper",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	for _, bad := range []string{"", "NOPE", "SIGNOPE", "0", "65"} {
		_, err := e.pc.SignalProcess(ctx, connect.NewRequest(&datav1.SignalProcessRequest{
			Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Tag{Tag: "sleeper"}}, Signal: bad,
		}))
		wantCode(t, err, connect.CodeInvalidArgument, stageUsingProcess)
	}
	if _, err := e.pc.SignalProcess(ctx, connect.NewRequest(&datav1.SignalProcessRequest{
		Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Tag{Tag: "sleeper"}}, Signal: "kill",
	})); err != nil {
		t.Fatal(err)
	}
	r := collect(t, stream)
	if r.exited.GetSignal() != "SIGKILL" {
		t.Fatalf("exited %v, want SIGKILL", r.exited)
	}
	// An ended process, whose group has no one left, can no longer be
	// signalled.
	_, err = e.pc.SignalProcess(ctx, connect.NewRequest(&datav1.SignalProcessRequest{
		Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Tag{Tag: "sleeper"}}, Signal: "TERM",
	}))
	wantCode(t, err, connect.CodeFailedPrecondition, stageUsingProcess)
}

// TestSelectorOfAnotherBoot: a selector naming another boot of the guest
// finds nothing, though a process of this boot has the pid; one naming
// this boot, or none, finds it.
func TestSelectorOfAnotherBoot(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"sleep", "100"}}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatal(stream.Err())
	}
	started := stream.Msg().GetStarted()
	if started.GetBootId() == "" {
		t.Fatal("the started event names no boot")
	}
	signal := func(boot string) error {
		_, err := e.pc.SignalProcess(ctx, connect.NewRequest(&datav1.SignalProcessRequest{Signal: "CONT",
			Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: started.GetPid()}, BootId: boot}}))
		return err
	}
	wantCode(t, signal("an-earlier-boot"), connect.CodeNotFound, stageUsingProcess)
	for _, boot := range []string{started.GetBootId(), ""} {
		if err := signal(boot); err != nil {
			t.Errorf("signal naming boot %q: %v", boot, err)
		}
	}
}

// TestChildHoldingOutputLivesOn: a command that leaves a child holding
// its output ends (its exit reported a little after, with what it wrote)
// while the child lives on: what the child writes later is dropped, and
// does not kill it with SIGPIPE.
func TestChildHoldingOutputLivesOn(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	alive := filepath.Join(t.TempDir(), "alive")
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-c", "(sleep 3; echo late; touch " + alive + ") & echo early"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, stream)
	if r.stdout.String() != "early\n" || r.exited.GetExitCode() != 0 {
		t.Fatalf("stdout %q, exit %v; want early and 0", r.stdout.String(), r.exited)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(alive); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child writing after its command's exit did not live on")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSignalReachesChildrenOfAnEndedCommand: a command that ended leaving
// children in the background (`cmd &`) is still killed with them: the
// signal reaches its group while members remain.
func TestSignalReachesChildrenOfAnEndedCommand(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-c", "sleep 100 >/dev/null 2>&1 &"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, stream)
	pgid := int(r.pid)
	if len(pgroupMembers(pgid)) != 1 {
		t.Fatalf("group %d after its leader's exit: %v, want the background sleep", pgid, pgroupMembers(pgid))
	}
	sel := &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: r.pid}}
	if _, err := e.pc.SignalProcess(ctx, connect.NewRequest(&datav1.SignalProcessRequest{Process: sel, Signal: "KILL"})); err != nil {
		t.Fatalf("killing the command whose leader ended: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(pgroupMembers(pgid)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("group %d still has %v after KILL", pgid, pgroupMembers(pgid))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestParseSignal(t *testing.T) {
	for in, want := range map[string]int{"SIGTERM": 15, "TERM": 15, "term": 15, "KILL": 9, "9": 9, "SIGHUP": 1, " INT ": 2, "SIG34": 34, "sig64": 64} {
		if sig, ok := parseSignal(in); !ok || int(sig) != want {
			t.Errorf("parseSignal(%q) = %d, %v; want %d", in, sig, ok, want)
		}
	}
	for _, in := range []string{"", "SIG", "FOO", "0", "-1", "65", "SIGKILLX", "SIG65", "SIG0"} {
		if sig, ok := parseSignal(in); ok {
			t.Errorf("parseSignal(%q) = %d, want failure", in, sig)
		}
	}
}

func TestStdinRoundTrip(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"cat"}, Stdin: true,
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{}
	r.waitFor(t, stream, "started", func() bool { return r.pid != 0 })
	sel := &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: r.pid}}
	for _, s := range []string{"hello ", "world\n"} {
		if _, err := e.pc.SendInput(ctx, connect.NewRequest(&datav1.SendInputRequest{Process: sel, Data: []byte(s)})); err != nil {
			t.Fatal(err)
		}
	}
	r.waitFor(t, stream, "echo", func() bool { return r.stdout.String() == "hello world\n" })
	if _, err := e.pc.CloseInput(ctx, connect.NewRequest(&datav1.CloseInputRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, stream, "exit", func() bool { return r.exited != nil })
	if r.exited.GetExitCode() != 0 || r.exited.GetSignal() != "" {
		t.Fatalf("exited %v", r.exited)
	}
	_, err = e.pc.SendInput(ctx, connect.NewRequest(&datav1.SendInputRequest{Process: sel, Data: []byte("x")}))
	wantCode(t, err, connect.CodeFailedPrecondition, stageUsingProcess)

	// Without stdin the process reads EOF, and SendInput is refused.
	stream, err = e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-c", "cat; echo done"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	r = collect(t, stream)
	if r.stdout.String() != "done\n" {
		t.Fatalf("without stdin: %q", r.stdout.String())
	}
}

func TestPTY(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-i"}, Pty: &datav1.Pty{Cols: 100, Rows: 30},
		Env: map[string]string{"PS1": "prompt> "},
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{}
	r.waitFor(t, stream, "prompt", func() bool { return strings.Contains(r.pty.String(), "prompt> ") })
	sel := &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: r.pid}}
	send := func(s string) {
		t.Helper()
		if _, err := e.pc.SendInput(ctx, connect.NewRequest(&datav1.SendInputRequest{Process: sel, Data: []byte(s)})); err != nil {
			t.Fatal(err)
		}
	}
	send("echo $((6*7)); stty size; tty\n")
	// The terminal echoes the command and turns \n into \r\n.
	r.waitFor(t, stream, "answer", func() bool { return strings.Contains(r.pty.String(), "\r\n42\r\n30 100\r\n/dev/pts/") })
	// The next prompt: input typed before it would be echoed before it.
	r.waitFor(t, stream, "second prompt", func() bool { return strings.Count(r.pty.String(), "prompt> ") == 2 })
	if _, err := e.pc.ResizeTerminal(ctx, connect.NewRequest(&datav1.ResizeTerminalRequest{Process: sel, Size: &datav1.Pty{Cols: 50, Rows: 20}})); err != nil {
		t.Fatal(err)
	}
	send("stty size\n")
	r.waitFor(t, stream, "new size", func() bool { return strings.Contains(r.pty.String(), "\r\n20 50\r\n") })
	send("exit 5\n")
	r.waitFor(t, stream, "exit", func() bool { return r.exited != nil })
	if r.exited.GetExitCode() != 5 {
		t.Fatalf("exited %v; output %q", r.exited, r.pty.String())
	}
	if r.stdout.Len() != 0 || r.stderr.Len() != 0 {
		t.Fatalf("pipe output from a PTY process: %q %q", r.stdout.String(), r.stderr.String())
	}
	// Ctrl-D through CloseInput ends cat on a terminal.
	stream, err = e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"cat"}, Pty: &datav1.Pty{}}))
	if err != nil {
		t.Fatal(err)
	}
	r = &run{}
	r.waitFor(t, stream, "started", func() bool { return r.pid != 0 })
	sel = &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: r.pid}}
	if _, err := e.pc.CloseInput(ctx, connect.NewRequest(&datav1.CloseInputRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, stream, "exit", func() bool { return r.exited != nil })
	if r.exited.GetExitCode() != 0 {
		t.Fatalf("cat after ^D: %v", r.exited)
	}
	// After a partial last line too: the line is handed over, and cat ends.
	stream, err = e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"cat"}, Pty: &datav1.Pty{}, Stdin: true}))
	if err != nil {
		t.Fatal(err)
	}
	r = &run{}
	r.waitFor(t, stream, "started", func() bool { return r.pid != 0 })
	sel = &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: r.pid}}
	if _, err := e.pc.SendInput(ctx, connect.NewRequest(&datav1.SendInputRequest{Process: sel, Data: []byte("abc")})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pc.CloseInput(ctx, connect.NewRequest(&datav1.CloseInputRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, stream, "exit", func() bool { return r.exited != nil })
	if r.exited.GetExitCode() != 0 || !strings.Contains(r.pty.String(), "abcabc") {
		t.Fatalf("cat after a partial line and the end of input: %v, %q", r.exited, r.pty.String())
	}
	// Resizing a process without a terminal is refused.
	stream, err = e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"sleep", "10"}}))
	if err != nil {
		t.Fatal(err)
	}
	r = &run{}
	r.waitFor(t, stream, "started", func() bool { return r.pid != 0 })
	_, err = e.pc.ResizeTerminal(ctx, connect.NewRequest(&datav1.ResizeTerminalRequest{
		Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: r.pid}}, Size: &datav1.Pty{Cols: 1, Rows: 1},
	}))
	wantCode(t, err, connect.CodeFailedPrecondition, stageUsingProcess)
}

func TestSignalKillsTree(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-c", "sleep 100 & sleep 100"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{}
	r.waitFor(t, stream, "started", func() bool { return r.pid != 0 })
	pgid := int(r.pid)
	deadline := time.Now().Add(10 * time.Second)
	for len(pgroupMembers(pgid)) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("group %d: %v, want sh and two sleeps", pgid, pgroupMembers(pgid))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := e.pc.SignalProcess(ctx, connect.NewRequest(&datav1.SignalProcessRequest{
		Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: r.pid}}, Signal: "SIGKILL",
	})); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, stream, "exit", func() bool { return r.exited != nil })
	if r.exited.GetSignal() != "SIGKILL" {
		t.Fatalf("exited %v", r.exited)
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(pgroupMembers(pgid)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("group %d still has %v after KILL", pgid, pgroupMembers(pgid))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConnectReplaysOutput(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	first, cancel := context.WithCancel(ctx)
	stream, err := e.pc.StartProcess(first, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-c", "echo hello; read x; echo world $x"}, Stdin: true, Tag: "job",
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{}
	r.waitFor(t, stream, "hello", func() bool { return r.stdout.String() == "hello\n" })
	cancel() // the caller goes away; the process stays
	stream.Close()

	// The tag is taken while the process runs.
	_, err = e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"true"}, Tag: "job"}))
	if err == nil {
		// A server stream reports its error on the first Receive.
		s, _ := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"true"}, Tag: "job"}))
		s.Receive()
		err = s.Err()
	}
	wantCode(t, err, connect.CodeAlreadyExists, stageStartingProcess)

	list, err := e.pc.ListProcesses(ctx, connect.NewRequest(&datav1.ListProcessesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(list.Msg.GetProcesses(), func(p *datav1.ProcessInfo) bool {
		return p.GetTag() == "job" && p.GetPid() == r.pid && p.GetExited() == nil && p.GetUser() == "root"
	}) {
		t.Fatalf("job not listed as running: %v", list.Msg.GetProcesses())
	}

	again, err := e.pc.ConnectProcess(ctx, connect.NewRequest(&datav1.ConnectProcessRequest{
		Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Tag{Tag: "job"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	r2 := &run{} // started first: by tag, the caller learns the pid
	r2.waitFor(t, again, "replay", func() bool { return r2.stdout.String() == "hello\n" })
	if r2.pid != r.pid {
		t.Fatalf("ConnectProcess by tag started with pid %d, want %d", r2.pid, r.pid)
	}
	if _, err := e.pc.SendInput(ctx, connect.NewRequest(&datav1.SendInputRequest{
		Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Tag{Tag: "job"}}, Data: []byte("42\n"),
	})); err != nil {
		t.Fatal(err)
	}
	r2.waitFor(t, again, "exit", func() bool { return r2.exited != nil })
	if r2.stdout.String() != "hello\nworld 42\n" || r2.exited.GetExitCode() != 0 {
		t.Fatalf("stdout %q exited %v", r2.stdout.String(), r2.exited)
	}

	// An ended process replays too, and is listed with its exit.
	third, err := e.pc.ConnectProcess(ctx, connect.NewRequest(&datav1.ConnectProcessRequest{
		Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Pid{Pid: r.pid}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	r3 := &run{}
	for third.Receive() {
		r3.add(t, third.Msg())
	}
	if third.Err() != nil || r3.stdout.String() != "hello\nworld 42\n" || r3.exited == nil {
		t.Fatalf("after exit: %v %q %v", third.Err(), r3.stdout.String(), r3.exited)
	}
	list, err = e.pc.ListProcesses(ctx, connect.NewRequest(&datav1.ListProcessesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(list.Msg.GetProcesses(), func(p *datav1.ProcessInfo) bool {
		return p.GetTag() == "job" && p.GetExited() != nil && p.GetStartedAt() != nil
	}) {
		t.Fatalf("job not listed as ended: %v", list.Msg.GetProcesses())
	}

	// Unknown and malformed selectors.
	s, _ := e.pc.ConnectProcess(ctx, connect.NewRequest(&datav1.ConnectProcessRequest{
		Process: &datav1.ProcessSelector{Selector: &datav1.ProcessSelector_Tag{Tag: "nope"}},
	}))
	s.Receive()
	wantCode(t, s.Err(), connect.CodeNotFound, stageStreamingProcess)
	_, err = e.pc.SendInput(ctx, connect.NewRequest(&datav1.SendInputRequest{}))
	wantCode(t, err, connect.CodeInvalidArgument, stageUsingProcess)
}

func TestStartErrors(t *testing.T) {
	e := newTestEnv(t)
	checkStartErrors(t, e, testCtx(t, 30*time.Second))
}

// checkStartErrors starts processes that cannot start and checks the
// codes of their errors.
func checkStartErrors(t *testing.T, e *testEnv, ctx context.Context) {
	t.Helper()
	notExec := filepath.Join(sharedDir(t), "not-a-program")
	if err := os.WriteFile(notExec, []byte{0x7f, 'E', 'L', 'F', 0}, 0o755); err != nil {
		t.Fatal(err)
	}
	longArgs := []string{"true"}
	for range 48 {
		longArgs = append(longArgs, strings.Repeat("a", 64<<10)) // 3 MiB in all
	}
	for _, c := range []struct {
		req  *datav1.StartProcessRequest
		code connect.Code
	}{
		{&datav1.StartProcessRequest{}, connect.CodeInvalidArgument},
		{&datav1.StartProcessRequest{Args: []string{"no-such-program-kibotos"}}, connect.CodeNotFound},
		{&datav1.StartProcessRequest{Args: []string{"/no/such/program"}}, connect.CodeNotFound},
		{&datav1.StartProcessRequest{Args: []string{"/etc/passwd"}}, connect.CodePermissionDenied},
		{&datav1.StartProcessRequest{Args: []string{notExec}}, connect.CodeFailedPrecondition},
		{&datav1.StartProcessRequest{Args: longArgs}, connect.CodeInvalidArgument},
		{&datav1.StartProcessRequest{Args: []string{"true"}, User: "no-such-user-kibotos"}, connect.CodeInvalidArgument},
		{&datav1.StartProcessRequest{Args: []string{"true"}, Cwd: "/no/such/dir"}, connect.CodeFailedPrecondition},
		{&datav1.StartProcessRequest{Args: []string{"true"}, Cwd: "/etc/passwd"}, connect.CodeFailedPrecondition},
		{&datav1.StartProcessRequest{Args: []string{"true"}, Env: map[string]string{"A=B": "x"}}, connect.CodeInvalidArgument},
		{&datav1.StartProcessRequest{Args: []string{"true"}, Cwd: "/root", User: "nobody"}, connect.CodePermissionDenied},
	} {
		s, err := e.pc.StartProcess(ctx, connect.NewRequest(c.req))
		if err == nil {
			s.Receive()
			err = s.Err()
		}
		wantCode(t, err, c.code, stageStartingProcess)
	}
}

// TestLargeOutput checks that a stream attached from the start loses no
// byte of output much larger than the buffer.
func TestLargeOutput(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 60*time.Second)
	stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-c", "head -c 5000000 /dev/zero; echo end >&2"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var exited *datav1.ProcessEvent_Exited
	for stream.Receive() {
		n += len(stream.Msg().GetStdout())
		if x := stream.Msg().GetExited(); x != nil {
			exited = x
		}
		if n < 2<<20 {
			time.Sleep(time.Millisecond) // a slow reader at first
		}
	}
	if stream.Err() != nil || n != 5000000 || exited.GetExitCode() != 0 {
		t.Fatalf("err %v, %d bytes, exited %v", stream.Err(), n, exited)
	}
}

// TestSlowReaderKeepsItsOutput: an exec that has not read all of its
// process's output when more ended processes' output than the guest keeps
// arrives still gets every byte and the exit: the budget drops only what
// no reader needs. It used to cut the reader short, silently, under the
// right exit code (30 execs at once lost the ends of half their outputs).
func TestSlowReaderKeepsItsOutput(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 60*time.Second)
	const size = 900 << 10 // within a process's log: it ends unread
	script := fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a; echo done >&2; exit 3", size)
	// Over HTTP/1.1 the socket's buffer alone is ahead of the reader (an
	// HTTP/2 stream's window would take all of the output at once).
	h1 := &http.Transport{DialContext: e.dial}
	defer h1.CloseIdleConnections()
	slow, err := datav1connect.NewProcessServiceClient(&http.Client{Transport: h1}, "http://guest").StartProcess(ctx,
		connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"sh", "-c", script}}))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{}
	r.waitFor(t, slow, "the slow reader's first output", func() bool { return r.stdout.Len() > 0 })
	for range endedOutputBudget/size + 2 { // their output passes the budget of ended processes
		s, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"sh", "-c", script}}))
		if err != nil {
			t.Fatal(err)
		}
		if o := collect(t, s); o.stdout.Len() != size || o.exited.GetExitCode() != 3 {
			t.Fatalf("another process: %d bytes, exit %v", o.stdout.Len(), o.exited)
		}
	}
	for slow.Receive() {
		r.add(t, slow.Msg())
	}
	if r.stdout.Len() != size || r.stderr.String() != "done\n" || r.exited.GetExitCode() != 3 {
		t.Errorf("the slow reader got %d of %d bytes, stderr %q, exit %v", r.stdout.Len(), size, r.stderr.String(), r.exited)
	}
}

// TestEndWithCaller: a process started with end_with_caller, its group
// too, is killed once the call that started it ends before it does, as
// when its caller dies; one waiting for input would otherwise wait for
// ever (TestConnectReplaysOutput: without it, the process stays).
func TestEndWithCaller(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	call, cancel := context.WithCancel(ctx)
	stream, err := e.pc.StartProcess(call, connect.NewRequest(&datav1.StartProcessRequest{
		Args: []string{"sh", "-c", "sleep 100 & read x"}, Stdin: true, EndWithCaller: true,
	}))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{}
	r.waitFor(t, stream, "started", func() bool { return r.pid != 0 })
	pgid := int(r.pid)
	for deadline := time.Now().Add(10 * time.Second); len(pgroupMembers(pgid)) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("group %d: %v, want sh and sleep", pgid, pgroupMembers(pgid))
		}
	}
	cancel() // the caller goes away
	stream.Close()
	for deadline := time.Now().Add(10 * time.Second); len(pgroupMembers(pgid)) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("group %d still has %v after its caller went away", pgid, pgroupMembers(pgid))
		}
	}
}

// TestEndWithCallerSparesAProcessThatExited: a process started with
// end_with_caller whose stream ended with its exit kills nothing of its
// group, however soon after the exit the stream ends (ListProcesses
// callers delay the process's retirement).
func TestEndWithCallerSparesAProcessThatExited(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 60*time.Second)
	listing, stop := context.WithCancel(ctx)
	var listers sync.WaitGroup
	defer func() { stop(); listers.Wait() }()
	for range 4 {
		listers.Go(func() {
			for listing.Err() == nil {
				e.pc.ListProcesses(listing, connect.NewRequest(&datav1.ListProcessesRequest{}))
			}
		})
	}
	for i := range 100 {
		stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
			Args: []string{"sh", "-c", "sleep 60 </dev/null >/dev/null 2>&1 & echo $!"}, EndWithCaller: true,
		}))
		if err != nil {
			t.Fatal(err)
		}
		r := collect(t, stream)
		child, err := strconv.Atoi(strings.TrimSpace(r.stdout.String()))
		if err != nil || r.exited == nil {
			t.Fatalf("run %d: %q, %v", i, r.stdout.String(), r.exited)
		}
		time.Sleep(10 * time.Millisecond)
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child))
		if err != nil || strings.Contains(string(stat), ") Z ") {
			t.Fatalf("run %d: the child of a process that exited was killed with its group", i)
		}
		unix.Kill(child, unix.SIGKILL)
	}
}
