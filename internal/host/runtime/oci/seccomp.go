package oci

import (
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// deniedSyscalls are refused with EPERM in every guest. Guest root is host
// uid 0 without a user namespace, so these kernel interfaces, which a
// workspace never needs and which have a history of privilege escalation
// or of reaching host-wide state (the keyring, BPF, perf, io_uring,
// kernel modules, new user namespaces), stay closed. The capabilities the
// guest lacks already block most of the rest.
var deniedSyscalls = []string{
	"acct", "add_key", "bpf", "delete_module", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
	"init_module", "io_uring_enter", "io_uring_register", "io_uring_setup", "kexec_file_load", "kexec_load",
	"keyctl", "lookup_dcookie", "mount_setattr", "move_mount", "name_to_handle_at", "nfsservctl",
	"open_by_handle_at", "open_tree", "perf_event_open", "pivot_root", "quotactl", "request_key", "setns",
	"swapoff", "swapon", "syslog", "umount2", "unshare", "userfaultfd", "uselib", "ustat", "vm86", "vm86old",
}

// seccompProfile allows every syscall but deniedSyscalls, clone with
// CLONE_NEWUSER (new user namespaces), and clone3, which answers ENOSYS so
// that libc falls back to clone, where the flag can be inspected.
func seccompProfile() *specs.LinuxSeccomp {
	eperm := uint(unix.EPERM)
	enosys := uint(unix.ENOSYS)
	return &specs.LinuxSeccomp{
		DefaultAction: specs.ActAllow,
		Architectures: []specs.Arch{specs.ArchX86_64, specs.ArchX86, specs.ArchX32},
		Syscalls: []specs.LinuxSyscall{
			{Names: deniedSyscalls, Action: specs.ActErrno, ErrnoRet: &eperm},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
			{Names: []string{"clone"}, Action: specs.ActErrno, ErrnoRet: &eperm, Args: []specs.LinuxSeccompArg{
				{Index: 0, Value: unix.CLONE_NEWUSER, ValueTwo: unix.CLONE_NEWUSER, Op: specs.OpMaskedEqual},
			}},
		},
	}
}
