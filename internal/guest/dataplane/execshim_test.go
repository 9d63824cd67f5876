package dataplane

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// TestMain lets the test binary serve as the exec shim, as the agent's
// binary does.
func TestMain(m *testing.M) {
	RunExecShim()
	os.Exit(m.Run())
}

// TestExecShim starts processes while this process's oom_score_adj is
// not 0: they run at 0, and the errors of starts that fail are those of
// a direct exec.
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
