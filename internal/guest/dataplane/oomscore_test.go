package dataplane

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// oomScoreAdj is this process's oom_score_adj.
const oomScoreAdj = "/proc/self/oom_score_adj"

// readOOMScoreAdj returns this process's oom_score_adj.
func readOOMScoreAdj() (int, error) {
	b, err := os.ReadFile(oomScoreAdj)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// TestExecShim starts processes while this process's oom_score_adj is
// not 0: they run at 0, through the exec shim (the test binary, which
// links it, as the agent's does), and the errors of starts that fail are
// those of a direct exec.
func TestExecShim(t *testing.T) {
	e := newTestEnv(t)
	ctx := testCtx(t, 30*time.Second)
	old, err := readOOMScoreAdj()
	if err != nil {
		t.Fatal(err)
	}
	// Raising needs no privilege; back to where it was does, below 0.
	if err := os.WriteFile(oomScoreAdj, []byte("300"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(oomScoreAdj, []byte(strconv.Itoa(old)), 0); err != nil {
			t.Errorf("restoring oom_score_adj %d: %v", old, err)
		}
	})
	for _, user := range []string{"", "nobody"} {
		stream, err := e.pc.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{
			Args: []string{"cat", "/proc/self/oom_score_adj"}, User: user,
		}))
		if err != nil {
			t.Fatal(err)
		}
		r := collect(t, stream)
		if got := strings.TrimSpace(r.stdout.String()); got != "0" || r.exited.GetExitCode() != 0 {
			t.Errorf("as %q: oom_score_adj %q (%q, %v), want 0", user, got, r.stderr.String(), r.exited)
		}
	}
	checkStartErrors(t, e, ctx)
}

// BenchmarkStart starts `true` and waits for its exit, directly and
// through the exec shim (this process's oom_score_adj raised).
func BenchmarkStart(b *testing.B) {
	hosttest.RequireRoot(b)
	procs := NewProcessService(ProcessConfig{Waiter: ChildWaiter{}})
	old, err := readOOMScoreAdj()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.WriteFile(oomScoreAdj, []byte(strconv.Itoa(old)), 0) })
	for _, bc := range []struct{ name, adj string }{{"direct", strconv.Itoa(old)}, {"shim", "300"}} {
		b.Run(bc.name, func(b *testing.B) {
			if err := os.WriteFile(oomScoreAdj, []byte(bc.adj), 0); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				p, cur, err := procs.start(&datav1.StartProcessRequest{Args: []string{"true"}})
				if err != nil {
					b.Fatal(err)
				}
				p.out.detach(cur)
				<-p.done
			}
		})
	}
}
