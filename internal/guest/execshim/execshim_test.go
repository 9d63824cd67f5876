package execshim

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
)

// TestForkExecThroughShim starts programs while this process's
// oom_score_adj is not 0: through the native shim on linux/amd64, which
// runs a program as it is and reports one that cannot be executed with
// the errno of a direct exec, leaving a child that exits with 127.
func TestForkExecThroughShim(t *testing.T) {
	if runtime.GOARCH == "amd64" && nativeShim() == nil {
		t.Fatal("no native shim: its memfd could not be made")
	}
	old, err := readOOMScoreAdj()
	if err != nil {
		t.Fatal(err)
	}
	// Raising needs no privilege.
	if err := os.WriteFile(oomScoreAdj, []byte("300"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(oomScoreAdj, []byte(strconv.Itoa(old)), 0) })
	attr := &syscall.ProcAttr{Files: []uintptr{0, 1, 2}}
	run := func(path string, args ...string) (int, error) {
		t.Helper()
		pid, started, err := ForkExec(path, args, attr)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		err = started()
		var ws syscall.WaitStatus
		if _, werr := syscall.Wait4(pid, &ws, 0, nil); werr != nil {
			t.Fatal(werr)
		}
		return ws.ExitStatus(), err
	}
	if code, err := run("/bin/sh", "sh", "-c", `test "$(cat /proc/self/oom_score_adj)" = 0 && exit 7`); err != nil || code != 7 {
		t.Errorf("sh through the shim: exit %d, %v; want 7 (at oom_score_adj 0)", code, err)
	}
	if code, err := run("/nonexistent", "x"); !errors.Is(err, syscall.ENOENT) || code != 127 {
		t.Errorf("/nonexistent through the shim: exit %d, %v; want ENOENT and 127", code, err)
	}
}
