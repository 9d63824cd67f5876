// Package execshim lets the processes the guest agent starts run at an
// oom_score_adj of 0, the default, whatever the agent's own: the runtime
// protects the agent from the OOM killer (below 0), and its processes must
// not be. oom_score_adj is inherited through fork and exec, and Go runs no
// code of ours in a child between the two; so while the agent's is not 0,
// ForkExec has the child exec the agent's own binary as the shim, which
// sets its oom_score_adj to 0 (raising needs no privilege) and only then
// execs the program. The shim reports a failure on a close-on-exec pipe,
// so a program that cannot be executed fails the start as a direct exec
// would. The agent's binary must be executable by every user it starts
// processes as.
//
// The shim runs in this package's init: its imports are few, so it runs
// before most of the binary's initialisation, which it does not need.
package execshim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	// shimName is the shim's argv[0]; argv[1] is the program's path,
	// the rest its argv.
	shimName = "kibotos-exec"
	// shimSelf is the agent's own binary.
	shimSelf = "/proc/self/exe"
	// shimReportFD is the shim's descriptor of the pipe it reports on.
	shimReportFD = 3
	// oomScoreAdj is this process's oom_score_adj.
	oomScoreAdj = "/proc/self/oom_score_adj"
)

// The stages of a shim's report: one byte, then the errno (uint32, little
// endian).
const (
	shimFailedAdj  = 'a'
	shimFailedExec = 'e'
	shimReportLen  = 5
)

// init returns at once unless this process was started as the shim; then
// it resets oom_score_adj and execs the program, or reports why it could
// not and exits.
func init() {
	if len(os.Args) < 3 || os.Args[0] != shimName {
		return
	}
	unix.CloseOnExec(shimReportFD)
	stage, err := byte(shimFailedAdj), unprotect()
	if err == nil {
		stage, err = shimFailedExec, syscall.Exec(os.Args[1], os.Args[2:], os.Environ())
	}
	report := []byte{stage, 0, 0, 0, 0}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		binary.LittleEndian.PutUint32(report[1:], uint32(errno))
	}
	unix.Write(shimReportFD, report)
	os.Exit(127)
}

// unprotect sets this process's oom_score_adj to 0. It fails only if the
// score stays below 0: above 0, where lowering it needs a privilege, the
// process is not protected like the agent, which is what counts.
func unprotect() error {
	werr := resetOOMScoreAdj()
	adj, err := readOOMScoreAdj()
	if err != nil {
		return err
	}
	if adj < 0 {
		return werr
	}
	return nil
}

// resetOOMScoreAdj sets this process's oom_score_adj to 0.
func resetOOMScoreAdj() error {
	f, err := os.OpenFile(oomScoreAdj, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString("0")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readOOMScoreAdj returns this process's oom_score_adj.
func readOOMScoreAdj() (int, error) {
	b, err := os.ReadFile(oomScoreAdj)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// ForkExec starts the program at path as syscall.ForkExec does; while
// this process's oom_score_adj is not 0, through the shim, so that the
// program runs at 0. A failed exec leaves no child either way.
func ForkExec(path string, args []string, attr *syscall.ProcAttr) (int, error) {
	if adj, err := readOOMScoreAdj(); err != nil || adj == 0 {
		return syscall.ForkExec(path, args, attr)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	defer r.Close()
	shim := *attr
	shim.Files = append(slices.Clone(attr.Files), w.Fd())
	pid, err := syscall.ForkExec(shimSelf, append([]string{shimName, path}, args...), &shim)
	w.Close()
	if err != nil {
		return 0, err
	}
	var report [shimReportLen]byte
	n, _ := io.ReadFull(r, report[:])
	if n == 0 {
		return pid, nil // the pipe closed on exec: the program runs
	}
	// The shim exits after its report. The caller, which owns waiting,
	// learns of no child: reap it here.
	var ws unix.WaitStatus
	for {
		if _, err := unix.Wait4(pid, &ws, 0, nil); !errors.Is(err, unix.EINTR) {
			break
		}
	}
	errno := syscall.Errno(binary.LittleEndian.Uint32(report[1:]))
	switch {
	case n < shimReportLen:
		return 0, errors.New("exec shim: cut report")
	case report[0] == shimFailedAdj:
		return 0, fmt.Errorf("reset oom_score_adj: %w", errno)
	}
	return 0, errno
}
