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
// On linux/amd64 the shim is a native program of under 1 KiB
// (shim_linux_amd64.asm), which the agent keeps in a sealed memfd: a start
// through it costs one more execve, not the start of a Go runtime and of
// the agent's package initialisation (about 5 ms of CPU per process on a
// small VM). Elsewhere, or where a memfd cannot be executed
// (vm.memfd_noexec), the agent's own binary is the shim: it runs in this
// package's init, whose imports are few.
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
	"sync"
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
	// nativeShimPath is the native shim as the child execs it: its
	// descriptor of the memfd, which the shim closes.
	nativeShimPath = "/proc/self/fd/4"
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
// program runs at 0. An error means no child was left. Otherwise started
// waits until the program runs and returns nil, or returns why it could
// not be executed; then the child (the shim) exits at once, and the
// caller, which owns waiting, reaps it as any other. started blocks for
// the shim's run (a whole runtime start where the agent's binary is the
// shim): calling it after the child's pid is registered, outside any lock
// held over the fork, lets other starts and the reaping of other children
// go on meanwhile.
func ForkExec(path string, args []string, attr *syscall.ProcAttr) (pid int, started func() error, err error) {
	if adj, err := readOOMScoreAdj(); err != nil || adj == 0 {
		pid, err := syscall.ForkExec(path, args, attr)
		return pid, func() error { return nil }, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	shim, self := *attr, shimSelf
	shim.Files = append(slices.Clone(attr.Files), w.Fd())
	if img := nativeShim(); img != nil {
		shim.Files, self = append(shim.Files, img.Fd()), nativeShimPath
	}
	pid, err = syscall.ForkExec(self, append([]string{shimName, path}, args...), &shim)
	w.Close()
	if err != nil {
		r.Close()
		return 0, nil, err
	}
	return pid, func() error {
		defer r.Close()
		return readReport(r)
	}, nil
}

// nativeShim returns the memfd of the native shim, made once; nil where
// there is none or it cannot be made.
var nativeShim = sync.OnceValue(func() *os.File {
	if len(nativeImage) == 0 {
		return nil
	}
	f, err := sealedExecutable(shimName, nativeImage)
	if err != nil {
		return nil
	}
	return f
})

// sealedExecutable returns a close-on-exec memfd holding image, executable
// by every user and sealed against any change.
func sealedExecutable(name string, image []byte) (*os.File, error) {
	const flags = unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	fd, err := unix.MemfdCreate(name, flags|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		// Before Linux 6.3, which knows no MFD_EXEC, every memfd is
		// executable.
		fd, err = unix.MemfdCreate(name, flags)
	}
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(image); err != nil {
		f.Close()
		return nil, err
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// readReport reads the shim's report: none, when the pipe closed on the
// program's exec, is success.
func readReport(r io.Reader) error {
	var report [shimReportLen]byte
	n, _ := io.ReadFull(r, report[:])
	if n == 0 {
		return nil
	}
	errno := syscall.Errno(binary.LittleEndian.Uint32(report[1:]))
	switch {
	case n < shimReportLen:
		return errors.New("exec shim: cut report")
	case report[0] == shimFailedAdj:
		return fmt.Errorf("reset oom_score_adj: %w", errno)
	}
	return errno
}
