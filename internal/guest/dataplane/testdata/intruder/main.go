// Command intruder runs inside a guest and reports, one line each, what
// it may do to a process (pid, its argument) and what it is itself:
//
//	attach: <errno or "ok">   PTRACE_ATTACH (detached again at once)
//	seize: <errno or "ok">    PTRACE_SEIZE (detached at exit)
//	mem: <errno or "ok">      opening /proc/<pid>/mem
//	environ: <errno or "ok">  reading /proc/<pid>/environ
//	dumpable: <0|1|2>         its own PR_GET_DUMPABLE
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

func main() {
	pid, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "usage: intruder <pid>")
		os.Exit(2)
	}
	// ptrace requests come from the tracing thread.
	runtime.LockOSThread()
	fmt.Println("attach:", result(attach(pid)))
	fmt.Println("seize:", result(unix.PtraceSeize(pid)))
	fmt.Println("mem:", result(open(fmt.Sprintf("/proc/%d/mem", pid))))
	fmt.Println("environ:", result(read(fmt.Sprintf("/proc/%d/environ", pid))))
	d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if err != nil {
		fmt.Println("dumpable:", result(err))
	} else {
		fmt.Println("dumpable:", d)
	}
}

func attach(pid int) error {
	if err := unix.PtraceAttach(pid); err != nil {
		return err
	}
	var ws unix.WaitStatus
	unix.Wait4(pid, &ws, unix.WALL, nil)
	return unix.PtraceDetach(pid)
}

func open(path string) error {
	f, err := os.Open(path)
	if err == nil {
		f.Close()
	}
	return err
}

func read(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Read(make([]byte, 1))
	return err
}

func result(err error) string {
	var errno unix.Errno
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &errno):
		return unix.ErrnoName(errno)
	}
	return err.Error()
}
