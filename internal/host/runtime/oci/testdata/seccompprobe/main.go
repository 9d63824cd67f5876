// Command seccompprobe tries kernel interfaces a guest must not reach and
// prints one line per try: the call's name and the error it got ("ok"
// when it succeeded). Every argument is harmless or invalid, so that a
// call the filter let through fails in the kernel or does nothing.
package main

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

type try struct {
	name string
	nr   uintptr
	args [6]uintptr
}

func str(s string) uintptr {
	b, _ := unix.BytePtrFromString(s)
	return uintptr(unsafe.Pointer(b))
}

func main() {
	none := str("/nonexistent")
	empty := str("")
	var handle [16]byte // too small a file handle: EOVERFLOW when allowed
	var mountID int32
	pid := uintptr(os.Getpid())
	fdcwd := unix.AT_FDCWD
	tries := []try{
		{"unshare(CLONE_NEWUSER)", unix.SYS_UNSHARE, [6]uintptr{unix.CLONE_NEWUSER}},
		{"unshare(CLONE_NEWNS)", unix.SYS_UNSHARE, [6]uintptr{unix.CLONE_NEWNS}},
		{"unshare(CLONE_NEWNET)", unix.SYS_UNSHARE, [6]uintptr{unix.CLONE_NEWNET}},
		// CLONE_FS with CLONE_NEWUSER is invalid: EINVAL when allowed.
		{"clone(CLONE_NEWUSER)", unix.SYS_CLONE, [6]uintptr{unix.CLONE_NEWUSER | unix.CLONE_FS}},
		{"clone(CLONE_NEWNET)", unix.SYS_CLONE, [6]uintptr{unix.CLONE_NEWNET | unix.CLONE_NEWUSER | unix.CLONE_FS}},
		{"clone3", unix.SYS_CLONE3, [6]uintptr{0, 0}},
		{"setns", unix.SYS_SETNS, [6]uintptr{^uintptr(0), 0}},
		{"mount", unix.SYS_MOUNT, [6]uintptr{empty, none, str("tmpfs"), 0, 0}},
		{"umount2", unix.SYS_UMOUNT2, [6]uintptr{none, unix.MNT_DETACH}},
		{"pivot_root", unix.SYS_PIVOT_ROOT, [6]uintptr{none, none}},
		{"fsopen", unix.SYS_FSOPEN, [6]uintptr{str("tmpfs"), 0}},
		{"fsconfig", unix.SYS_FSCONFIG, [6]uintptr{^uintptr(0), 0, 0, 0, 0}},
		{"fsmount", unix.SYS_FSMOUNT, [6]uintptr{^uintptr(0), 0, 0}},
		{"fspick", unix.SYS_FSPICK, [6]uintptr{^uintptr(0), empty, 0}},
		{"open_tree", unix.SYS_OPEN_TREE, [6]uintptr{^uintptr(0), empty, 0}},
		{"move_mount", unix.SYS_MOVE_MOUNT, [6]uintptr{^uintptr(0), empty, ^uintptr(0), empty, 0}},
		{"mount_setattr", unix.SYS_MOUNT_SETATTR, [6]uintptr{^uintptr(0), empty, 0, 0, 0}},
		{"keyctl", unix.SYS_KEYCTL, [6]uintptr{unix.KEYCTL_GET_KEYRING_ID, uintptr(0xfffffffd) /* session */, 0}},
		{"add_key", unix.SYS_ADD_KEY, [6]uintptr{0, 0, 0, 0, 0}},
		{"request_key", unix.SYS_REQUEST_KEY, [6]uintptr{0, 0, 0, 0}},
		{"bpf", unix.SYS_BPF, [6]uintptr{0, 0, 0}},
		{"perf_event_open", unix.SYS_PERF_EVENT_OPEN, [6]uintptr{0, 0, ^uintptr(0), ^uintptr(0), 0}},
		{"io_uring_setup", unix.SYS_IO_URING_SETUP, [6]uintptr{1, 0}},
		{"io_uring_enter", unix.SYS_IO_URING_ENTER, [6]uintptr{^uintptr(0), 0, 0, 0, 0, 0}},
		{"io_uring_register", unix.SYS_IO_URING_REGISTER, [6]uintptr{^uintptr(0), 0, 0, 0}},
		{"init_module", unix.SYS_INIT_MODULE, [6]uintptr{0, 0, empty}},
		{"finit_module", unix.SYS_FINIT_MODULE, [6]uintptr{^uintptr(0), empty, 0}},
		{"delete_module", unix.SYS_DELETE_MODULE, [6]uintptr{str("nonexistent"), 0}},
		{"kexec_load", unix.SYS_KEXEC_LOAD, [6]uintptr{0, 0, 0, 0xdead0000 /* invalid flags */}},
		{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD, [6]uintptr{^uintptr(0), ^uintptr(0), 0, 0, 0}},
		{"reboot", unix.SYS_REBOOT, [6]uintptr{0, 0, 0, 0}},
		{"swapon", unix.SYS_SWAPON, [6]uintptr{none, 0}},
		{"swapoff", unix.SYS_SWAPOFF, [6]uintptr{none}},
		{"acct", unix.SYS_ACCT, [6]uintptr{none}},
		{"syslog", unix.SYS_SYSLOG, [6]uintptr{10 /* SYSLOG_ACTION_SIZE_BUFFER */, 0, 0}},
		{"quotactl", unix.SYS_QUOTACTL, [6]uintptr{0, 0, 0, 0}},
		{"quotactl_fd", unix.SYS_QUOTACTL_FD, [6]uintptr{^uintptr(0), 0, 0, 0}},
		{"userfaultfd", unix.SYS_USERFAULTFD, [6]uintptr{unix.O_CLOEXEC}},
		{"lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE, [6]uintptr{0, 0, 0}},
		{"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT, [6]uintptr{uintptr(fdcwd), str("/"), uintptr(unsafe.Pointer(&handle)), uintptr(unsafe.Pointer(&mountID)), 0}},
		{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT, [6]uintptr{^uintptr(0), 0, 0}},
		{"settimeofday", unix.SYS_SETTIMEOFDAY, [6]uintptr{0, 0}},
		{"clock_settime", unix.SYS_CLOCK_SETTIME, [6]uintptr{unix.CLOCK_REALTIME, 0}},
		{"sethostname", unix.SYS_SETHOSTNAME, [6]uintptr{str("x"), 1}},
		{"setdomainname", unix.SYS_SETDOMAINNAME, [6]uintptr{str("x"), 1}},
		{"vhangup", unix.SYS_VHANGUP, [6]uintptr{}},
		{"kcmp", unix.SYS_KCMP, [6]uintptr{pid, pid, 0 /* KCMP_FILE */, 0, 0}},
		{"pidfd_getfd", unix.SYS_PIDFD_GETFD, [6]uintptr{^uintptr(0), 0, 0}},
		{"process_madvise", unix.SYS_PROCESS_MADVISE, [6]uintptr{^uintptr(0), 0, 0, 0, 0}},
		{"get_mempolicy", unix.SYS_GET_MEMPOLICY, [6]uintptr{0, 0, 0, 0, 0}},
		{"set_mempolicy", unix.SYS_SET_MEMPOLICY, [6]uintptr{0 /* MPOL_DEFAULT */, 0, 0}},
		{"mbind", unix.SYS_MBIND, [6]uintptr{0, 0, 0, 0, 0, 0}},
		{"move_pages", unix.SYS_MOVE_PAGES, [6]uintptr{0, 0, 0, 0, 0, 0}},
		{"migrate_pages", unix.SYS_MIGRATE_PAGES, [6]uintptr{0, 0, 0, 0}},
		{"fanotify_init", unix.SYS_FANOTIFY_INIT, [6]uintptr{0x200 /* FAN_REPORT_FID */, unix.O_RDONLY}},
		{"socket(AF_VSOCK)", unix.SYS_SOCKET, [6]uintptr{unix.AF_VSOCK, unix.SOCK_STREAM, 0}},
		{"personality(READ_IMPLIES_EXEC)", unix.SYS_PERSONALITY, [6]uintptr{0x0400000}},
	}
	for _, t := range tries {
		r, _, errno := unix.Syscall6(t.nr, t.args[0], t.args[1], t.args[2], t.args[3], t.args[4], t.args[5])
		if errno != 0 {
			fmt.Printf("%s %s\n", t.name, unix.ErrnoName(errno))
			continue
		}
		if int(r) > 2 && t.nr != unix.SYS_PERSONALITY && t.nr != unix.SYS_KCMP {
			unix.Close(int(r)) // a descriptor the call made
		}
		fmt.Printf("%s ok\n", t.name)
	}
}
