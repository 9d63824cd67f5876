package guestabi

import "bytes"

// How a guest ends its machine. The guest agent is the guest's PID 1, so
// the guest ends by ending it. Inside the guest, as on a machine whose
// init is busybox's, a signal to PID 1 asks for one of two ends:
//
//	SIGTERM, SIGINT    a reset: busybox `reboot`, `kill 1`, ctrl-alt-del
//	SIGUSR1, SIGUSR2   a shutdown: busybox `halt`, `poweroff`
//
// Either way the agent ends every other process (TERM, a grace, KILL),
// syncs the filesystems, records the end in EndFile and exits. The host
// reads EndFile once init has ended, because a runtime need not see
// init's exit status (a detached container's init is no process's child
// on the host): it starts a guest that reset again within the same
// execution and ends the execution of one that shut down. An init that
// ended without recording EndShutdown (a reset, or an agent that died:
// killed, crashed) counts as a reset. The guest's root can write EndFile
// too; that lets it choose only between the two ends it may ask for
// anyway.
//
// The host's own stop is the probe protocol's STOP; the agent records
// nothing for it, and the host, which asked, does not look. reboot(2)
// itself (`reboot -f`) is the runtime's business: the OCI runtime's
// seccomp profile refuses it (EPERM), so the guest keeps running.
const (
	// EndFile is the name, in SocketDir, of the file recording the end.
	EndFile = "end"
	// EndReset and EndShutdown are its contents, followed by a newline.
	EndReset    = "reset"
	EndShutdown = "shutdown"
	// MaxEndFile bounds what a reader of EndFile reads.
	MaxEndFile = 64
)

// Shutdown reports whether contents, read from EndFile, record a shutdown.
func Shutdown(contents []byte) bool {
	return string(bytes.TrimSpace(contents)) == EndShutdown
}
