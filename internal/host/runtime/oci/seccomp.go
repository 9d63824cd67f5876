package oci

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The guest's seccomp profile is an allowlist in the spirit of Docker's
// default profile: every syscall not named here answers EPERM, so a
// syscall a later kernel adds stays closed until it is reviewed. Guest
// root is host uid 0 without a user namespace, so what stays closed are
// the kernel interfaces a workspace never needs and which have a history
// of privilege escalation or of reaching host-wide state: new namespaces
// (unshare, setns, clone with namespace flags), mounts and the new mount
// API, the keyring, BPF, perf, io_uring, kernel modules, kexec, swap,
// accounting, quotas, the clock, reboot, userfaultfd, file handles,
// and the calls of capabilities the guest does not have. runc leaves out
// the names a kernel or libseccomp does not know.

// allowedSyscalls are allowed on every architecture, with any arguments.
var allowedSyscalls = []string{
	// Files and directories.
	"access", "chdir", "chmod", "chown", "chown32", "close", "close_range", "copy_file_range", "creat",
	"dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate",
	"fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64",
	"fdatasync", "fgetxattr", "flistxattr", "flock", "fremovexattr", "fsetxattr", "fstat", "fstat64",
	"fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate", "ftruncate64", "futimesat", "getcwd",
	"getdents", "getdents64", "getxattr", "lchown", "lchown32", "lgetxattr", "link", "linkat",
	"listxattr", "llistxattr", "_llseek", "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64",
	"mkdir", "mkdirat", "mknod", "mknodat", "newfstatat", "open", "openat", "openat2", "pread64",
	"preadv", "preadv2", "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink",
	"readlinkat", "readv", "removexattr", "rename", "renameat", "renameat2", "rmdir", "sendfile",
	"sendfile64", "setxattr", "splice", "stat", "stat64", "statfs", "statfs64", "statx", "symlink",
	"symlinkat", "sync", "sync_file_range", "syncfs", "tee", "truncate", "truncate64", "umask",
	"unlink", "unlinkat", "utime", "utimensat", "utimensat_time64", "utimes", "vmsplice", "write",
	"writev", "chroot", "fanotify_mark", "inotify_add_watch", "inotify_init", "inotify_init1",
	"inotify_rm_watch", "io_cancel", "io_destroy", "io_getevents", "io_pgetevents",
	"io_pgetevents_time64", "io_setup", "io_submit", "ioctl", "landlock_add_rule",
	"landlock_create_ruleset", "landlock_restrict_self",
	// Memory.
	"brk", "madvise", "membarrier", "memfd_create", "memfd_secret", "mincore", "mlock", "mlock2",
	"mlockall", "mmap", "mmap2", "mprotect", "mremap", "msync", "munlock", "munlockall", "munmap",
	"pkey_alloc", "pkey_free", "pkey_mprotect", "remap_file_pages",
	// Processes, threads, signals, scheduling.
	"alarm", "capget", "capset", "execve", "execveat", "exit", "exit_group", "fork", "vfork", "futex",
	"futex_time64", "futex_waitv", "getcpu", "getegid", "getegid32", "geteuid", "geteuid32", "getgid",
	"getgid32", "getgroups", "getgroups32", "getitimer", "getpgid", "getpgrp", "getpid", "getppid",
	"getpriority", "getrandom", "getresgid", "getresgid32", "getresuid", "getresuid32", "getrlimit",
	"get_robust_list", "getrusage", "getsid", "get_thread_area", "gettid", "getuid", "getuid32",
	"ioprio_get", "ioprio_set", "kill", "pause", "pidfd_open", "pidfd_send_signal", "prctl",
	"prlimit64", "process_mrelease", "restart_syscall", "rseq", "rt_sigaction", "rt_sigpending",
	"rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
	"rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_getaffinity", "sched_getattr",
	"sched_getparam", "sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler",
	"sched_rr_get_interval", "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr",
	"sched_setparam", "sched_setscheduler", "sched_yield", "seccomp", "setfsgid", "setfsgid32",
	"setfsuid", "setfsuid32", "setgid", "setgid32", "setgroups", "setgroups32", "setitimer",
	"setpgid", "setpriority", "setregid", "setregid32", "setresgid", "setresgid32", "setresuid",
	"setresuid32", "setreuid", "setreuid32", "setrlimit", "set_robust_list", "setsid",
	"set_thread_area", "set_tid_address", "setuid", "setuid32", "sigaltstack", "signalfd",
	"signalfd4", "sigprocmask", "sigreturn", "tgkill", "tkill", "ugetrlimit", "wait4", "waitid",
	"waitpid",
	// Debugging the guest's own processes: ptrace needs no capability for
	// a process of the same user that is dumpable, and the guest lacks
	// CAP_SYS_PTRACE, so the non-dumpable guest agent is out of reach.
	"ptrace", "process_vm_readv", "process_vm_writev",
	// Time.
	"clock_getres", "clock_getres_time64", "clock_gettime", "clock_gettime64", "clock_nanosleep",
	"clock_nanosleep_time64", "gettimeofday", "nanosleep", "time", "times", "timer_create",
	"timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64", "timer_settime",
	"timer_settime64", "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime",
	"timerfd_settime64",
	// Waiting on descriptors.
	"epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2",
	"epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "poll", "ppoll", "ppoll_time64",
	"pselect6", "pselect6_time64", "select", "_newselect", "pipe", "pipe2",
	// Sockets (socket itself below).
	"accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt", "listen",
	"recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "send", "sendmmsg", "sendmsg",
	"sendto", "setsockopt", "shutdown", "socketcall", "socketpair",
	// System V and POSIX IPC (in the guest's own IPC namespace).
	"ipc", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedreceive_time64",
	"mq_timedsend", "mq_timedsend_time64", "mq_unlink", "msgctl", "msgget", "msgrcv", "msgsnd",
	"semctl", "semget", "semop", "semtimedop", "semtimedop_time64", "shmat", "shmctl", "shmdt",
	"shmget",
	// The system, read-only.
	"sysinfo", "uname",
}

// archSyscalls are allowed on one architecture only.
var archSyscalls = map[string][]string{
	"amd64": {"arch_prctl", "modify_ldt"},
	"arm64": {"arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush", "set_tls"},
}

// archNames are the seccomp architectures of each Go architecture: the
// native one alone. A system call of another ABI (a 32-bit program's, or
// x32's) is not let through at all: the compat entry points are a large
// surface of their own, and each architecture listed makes runc compile
// the whole allowlist again at every start (amd64 with x86 and x32: about
// 20 ms of a 45 ms start here).
var archNames = map[string][]specs.Arch{
	"amd64": {specs.ArchX86_64},
	"arm64": {specs.ArchAARCH64},
}

// namespaceFlags are the clone flags that make new namespaces: clone
// with any of them is refused (without CAP_SYS_ADMIN only CLONE_NEWUSER
// would succeed, and a user namespace opens the rest).
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// afVsock is the address family refused to socket: the guest has no
// business with the host's virtual machine sockets.
const afVsock = unix.AF_VSOCK

// personalities are the execution domains allowed to personality: the
// default, and the flags and queries programs ask for.
var personalities = []uint64{0x0, 0x0008 /* UNAME26 */, 0x20000 /* ADDR_NO_RANDOMIZE */, 0x20008, 0xffffffff /* query */}

// seccompProfile returns the profile for goarch (amd64 or arm64; another
// architecture gets its native allowlist without the arch-specific
// calls, and an unknown one lets runc use the native architecture).
// clone3 answers ENOSYS, so that libc falls back to clone, whose flags
// the filter can inspect.
func seccompProfile(goarch string) *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	allowed := append(append([]string(nil), allowedSyscalls...), archSyscalls[goarch]...)
	rules := []specs.LinuxSyscall{
		{Names: allowed, Action: specs.ActAllow},
		{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{
			{Index: 0, Value: namespaceFlags, ValueTwo: 0, Op: specs.OpMaskedEqual},
		}},
		{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
		{Names: []string{"socket"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{
			{Index: 0, Value: afVsock, Op: specs.OpNotEqual},
		}},
	}
	for _, p := range personalities {
		rules = append(rules, specs.LinuxSyscall{Names: []string{"personality"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: p, Op: specs.OpEqualTo}}})
	}
	return &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &eperm,
		Architectures:   archNames[goarch],
		Syscalls:        rules,
	}
}
