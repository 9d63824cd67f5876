package dataplane

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestGuestOOM runs a guest whose agent has an oom_score_adj other than
// 0 (the runtime's protection, or the test's): the processes it starts
// run at 0, as root and as a user, and a memory hog among them is killed
// while the agent keeps serving.
func TestGuestOOM(t *testing.T) {
	g := startGuest(t, "guest-oom-test", 64<<20, nil)
	adj := func(user, pid string) string {
		t.Helper()
		r := g.run(t, &datav1.StartProcessRequest{Args: []string{"cat", "/proc/" + pid + "/oom_score_adj"}, User: user})
		if r.exited.GetExitCode() != 0 {
			t.Fatalf("oom_score_adj of %s: %q %v", pid, r.stderr.String(), r.exited)
		}
		return strings.TrimSpace(r.stdout.String())
	}
	if agent := adj("", "1"); agent == "0" {
		// The spec set none. Protect the agent from the host: the most
		// (-1000, under which the OOM killer would never pick its
		// children either unless they reset theirs) needs
		// CAP_SYS_RESOURCE; else raise it, which needs nothing.
		init := "/proc/" + strconv.Itoa(g.initPID(t)) + "/oom_score_adj"
		if err := os.WriteFile(init, []byte("-1000"), 0); err != nil {
			t.Logf("cannot protect the agent (%v): raising its oom_score_adj to 500", err)
			if err := os.WriteFile(init, []byte("500"), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	agent := adj("", "1")
	if agent == "0" {
		t.Fatal("the agent's oom_score_adj is 0")
	}
	for _, user := range []string{"", "app"} {
		if got := adj(user, "self"); got != "0" {
			t.Errorf("a process of %q runs at oom_score_adj %s (the agent at %s), want 0", user, got, agent)
		}
	}

	// The hog doubles a string until the memory limit kills it.
	hog := g.run(t, &datav1.StartProcessRequest{Args: []string{"awk", `BEGIN { s = "x"; while (1) s = s s }`}})
	if hog.exited.GetSignal() != "SIGKILL" {
		t.Fatalf("memory hog: %v, stderr %q; want killed", hog.exited, hog.stderr.String())
	}
	if r := g.run(t, &datav1.StartProcessRequest{Args: []string{"echo", "still serving"}}); r.stdout.String() != "still serving\n" {
		t.Fatalf("after the hog: %q %v", r.stdout.String(), r.exited)
	}
	if got := adj("", "1"); got != agent {
		t.Fatalf("the agent's oom_score_adj is %s after the hog, was %s: a new agent?", got, agent)
	}
	st, err := g.d.Status(g.ctx, g.id)
	if err != nil || !st.Running || !st.Ready {
		t.Fatalf("status after the hog: %+v, %v", st, err)
	}
}

// TestGuestPtrace checks that a guest process, root without
// CAP_SYS_PTRACE, can neither trace the agent nor read its memory or
// environment, while the processes the agent starts are dumpable as any.
func TestGuestPtrace(t *testing.T) {
	intruder := filepath.Join(t.TempDir(), "intruder")
	if err := testutil.Build(intruder, "github.com/kibotos/kibotos/internal/guest/dataplane/testdata/intruder"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(intruder)
	if err != nil {
		t.Fatal(err)
	}
	g := startGuest(t, "guest-ptrace-test", 256<<20, map[string][]byte{"bin/intruder": b})
	report := func(user, pid string) map[string]string {
		t.Helper()
		r := g.run(t, &datav1.StartProcessRequest{Args: []string{"intruder", pid}, User: user})
		if r.exited.GetExitCode() != 0 {
			t.Fatalf("intruder: %q %v", r.stderr.String(), r.exited)
		}
		m := make(map[string]string)
		for _, line := range strings.Split(strings.TrimSpace(r.stdout.String()), "\n") {
			k, v, _ := strings.Cut(line, ": ")
			m[k] = v
		}
		return m
	}
	got := report("", "1")
	want := map[string]string{"attach": "EPERM", "seize": "EPERM", "mem": "EACCES", "environ": "EACCES", "dumpable": "1"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("root against the agent: %s: %s, want %s", k, got[k], v)
		}
	}
	// The control: a process the agent started is within reach.
	sleeper, err := g.pc.StartProcess(g.ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"sleep", "1000"}, User: "app"}))
	if err != nil {
		t.Fatal(err)
	}
	r := &run{}
	r.waitFor(t, sleeper, "started", func() bool { return r.pid != 0 })
	got = report("app", strconv.Itoa(int(r.pid)))
	for _, k := range []string{"attach", "seize", "mem", "environ"} {
		if got[k] != "ok" {
			t.Errorf("app against its own sleep: %s: %s, want ok", k, got[k])
		}
	}
	if got["dumpable"] != "1" {
		t.Errorf("a process of app: dumpable %s, want 1", got["dumpable"])
	}
}

// initPID returns the host pid of the guest's PID 1.
func (g *guest) initPID(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("runc", "--root", filepath.Join(g.state, "runc"), "state", g.id).Output()
	if err != nil {
		t.Fatalf("runc state: %v", err)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("runc state: %q: %v", out, err)
	}
	return st.Pid
}
