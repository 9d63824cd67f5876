// Package forkexec starts the processes of the guest agent at an
// oom_score_adj of 0, the default, whatever the agent's own: the runtime
// protects the agent from the OOM killer (below 0), and its processes must
// not be. oom_score_adj belongs to the process and a child inherits it at
// fork, and Go runs no code of ours in a child between fork and exec; so
// while the agent's is not 0, ForkExec sets the agent's own to 0 for the
// length of the fork and exec, and back once the child runs the program.
//
// Setting it back needs no privilege: the kernel refuses an unprivileged
// write below the score's floor (oom_score_adj_min), which only a
// privileged write moves, to the value it writes; so the value a process
// has is never below its floor, and the agent may always return to the
// value it read. Raising the score needs no privilege either. While it is
// 0 the agent is as exposed to the OOM killer as its processes, for the
// time of one fork and exec; an exec through a shim (the agent's own
// binary, which set the score and then exec'd the program) cost a Go
// runtime's start on every process instead.
package forkexec

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// oomScoreAdj is this process's oom_score_adj.
const oomScoreAdj = "/proc/self/oom_score_adj"

// mu serialises ForkExec: the score is the process's, not a call's.
var mu sync.Mutex

// ForkExec starts the program at path as syscall.ForkExec does, at
// oom_score_adj 0 while this process's is not. A score above 0 that may
// not be lowered to 0 is kept: such a process is no better protected than
// its children. A failed exec leaves no child.
func ForkExec(path string, args []string, attr *syscall.ProcAttr) (int, error) {
	mu.Lock()
	defer mu.Unlock()
	adj, err := readOOMScoreAdj()
	if err != nil || adj == 0 {
		return syscall.ForkExec(path, args, attr)
	}
	if err := writeOOMScoreAdj(0); err != nil {
		if adj > 0 {
			return syscall.ForkExec(path, args, attr)
		}
		return 0, fmt.Errorf("reset oom_score_adj: %w", err)
	}
	pid, err := syscall.ForkExec(path, args, attr)
	// The value read is not below the floor: writing it back succeeds.
	writeOOMScoreAdj(adj)
	return pid, err
}

// readOOMScoreAdj returns this process's oom_score_adj.
func readOOMScoreAdj() (int, error) {
	b, err := os.ReadFile(oomScoreAdj)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// writeOOMScoreAdj sets this process's oom_score_adj.
func writeOOMScoreAdj(adj int) error {
	f, err := os.OpenFile(oomScoreAdj, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(strconv.Itoa(adj))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
