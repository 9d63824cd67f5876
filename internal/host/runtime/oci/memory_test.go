package oci

import (
	"testing"

	"github.com/kibotos/kibotos/internal/host/runtime"
)

// TestParseProcStatus: the PID in the innermost namespace and the
// resident set of a process; a zombie (no VmRSS) is not live; a status
// without NSpid is refused.
func TestParseProcStatus(t *testing.T) {
	running := "Name:\tsh\nState:\tS (sleeping)\nTgid:\t8558\nNSpid:\t8558\t31\nVmPeak:\t   90000 kB\nVmRSS:\t   79852 kB\nThreads:\t1\n"
	p, live, err := parseProcStatus([]byte(running))
	if want := (runtime.GuestProcess{PID: 31, RSSBytes: 79852 << 10}); err != nil || !live || p != want {
		t.Errorf("running: %+v, %v, %v; want %+v, live", p, live, err, want)
	}
	zombie := "Name:\tsh\nState:\tZ (zombie)\nNSpid:\t8558\t31\nThreads:\t1\n"
	if p, live, err := parseProcStatus([]byte(zombie)); err != nil || live || p.PID != 31 {
		t.Errorf("zombie: %+v, %v, %v; want not live", p, live, err)
	}
	for _, bad := range []string{"Name:\tsh\nVmRSS:\t1 kB\n", "NSpid:\tx\n", "NSpid:\t1\nVmRSS:\tx kB\n"} {
		if p, _, err := parseProcStatus([]byte(bad)); err == nil {
			t.Errorf("parseProcStatus(%q) = %+v, want an error", bad, p)
		}
	}
}
