package oci

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// Paths inside the guest.
const (
	guestAgentPath = guestabi.AgentPath
	guestSocketDir = guestabi.SocketDir
	resolvConfName = "resolv.conf" // in the socket directory on the host
	hostnameName   = "hostname"    // the guest's /etc/hostname, there too
	hostsName      = "hosts"       // and its /etc/hosts
	defaultPath    = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	cfsPeriod      = 100000  // µs
	ociVersion     = "1.0.2" // what runc 1.1 speaks; the fields used are all 1.0
	// oomNever is the oom_score_adj that keeps the kernel's OOM killer off
	// the guest agent: when the guest fills its memory, a guest process
	// dies, never PID 1. The agent sets the processes it starts back to
	// 0; the guest cannot lower a score (that needs CAP_SYS_RESOURCE),
	// only raise its own.
	oomNever = -1000
)

// defaultCaps is the capability set of Docker and containerd's default
// spec: enough for package managers and ordinary root work (chown,
// setuid, raw sockets, chroot) without administrative powers.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// maskedPaths and readonlyPaths are those of Docker's default spec: the
// runtime hides the masked ones (an empty read-only tmpfs over a
// directory, /dev/null over a file) and remounts the others read-only.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
		// The host's loop devices: their backing files name every
		// workspace's disk image on the host, and their stats its I/O.
		"/sys/devices/virtual/block",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// guestEnv returns PATH followed by extra, a later KEY overriding an
// earlier one in place.
func guestEnv(extra []string) []string {
	env := []string{defaultPath}
	index := map[string]int{"PATH": 0}
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := index[k]; ok {
			env[i] = kv
			continue
		}
		index[k] = len(env)
		env = append(env, kv)
	}
	return env
}

// ociSpec builds the runtime configuration of an execution whose rootfs,
// socket directory and volume (mounted at volume, when spec has one) are
// prepared on the host. tmpfsBytes sizes the guest's /tmp, /run and
// /dev/shm each (0: the kernel's default, half the host's memory);
// oomScoreAdj is the guest agent's.
func ociSpec(spec runtime.Spec, rootfs, sockDir, volume string, tmpfsBytes uint64, oomScoreAdj int) *specs.Spec {
	hostname := guestHostname(spec)
	caps := append([]string(nil), defaultCaps...)
	res := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
	}
	if spec.MemoryBytes > 0 {
		m := int64(spec.MemoryBytes)
		disable := false
		res.Memory = &specs.LinuxMemory{Limit: &m, Swap: &m, DisableOOMKiller: &disable}
	}
	if spec.CPUMillis > 0 {
		period := uint64(cfsPeriod)
		quota := int64(spec.CPUMillis) * cfsPeriod / 1000
		res.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if spec.PidsLimit > 0 {
		limit := spec.PidsLimit
		res.Pids = &specs.LinuxPids{Limit: &limit}
	}
	mounts := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		// Device nodes, links and sockets take no room; what a guest
		// writes there counts against its memory like its tmpfs, and at
		// 64 MiB (Docker's size) /dev with /dev/shm could take all of a
		// small guest's memory, its agent's included.
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=" + strconv.Itoa(devBytes)}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: tmpfsOptions("mode=1777", tmpfsBytes, "noexec")},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
		// The NONE tier: empty at every start. Their memory counts
		// against the execution's memory limit, so each is bounded to
		// leave the guest's processes (and its agent) room.
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: tmpfsOptions("mode=1777", tmpfsBytes)},
		{Destination: "/run", Type: "tmpfs", Source: "tmpfs", Options: tmpfsOptions("mode=755", tmpfsBytes)},
		// After /run, which would hide it.
		{Destination: guestSocketDir, Type: "bind", Source: sockDir, Options: []string{"rbind", "rw", "nosuid", "nodev", "noexec"}},
		{Destination: guestAgentPath, Type: "bind", Source: spec.GuestAgent, Options: []string{"bind", "ro", "nosuid", "nodev"}},
	}
	if spec.ResolvConf != nil {
		mounts = append(mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind",
			Source: filepath.Join(sockDir, resolvConfName), Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}})
	}
	// The guest's name as files tell it (writeIdentity), the guest's to
	// edit as resolv.conf is.
	for _, f := range [][2]string{{"/etc/hostname", hostnameName}, {"/etc/hosts", hostsName}} {
		mounts = append(mounts, specs.Mount{Destination: f[0], Type: "bind",
			Source: filepath.Join(sockDir, f[1]), Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}})
	}
	if spec.Volume != nil {
		// Last: the volume may lie below /tmp. runc makes its mount point.
		mounts = append(mounts, specs.Mount{Destination: spec.Volume.Path, Type: "bind",
			Source: volume, Options: []string{"rbind", "rw", "nosuid", "nodev"}})
	}
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: spec.NetNS} // no path: loopback only
	args := []string{guestAgentPath}
	if spec.Display != nil {
		args = append(args, spec.Display.Arg())
	}
	return &specs.Spec{
		Version: ociVersion,
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: args,
			Env:  guestEnv(spec.Env),
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			NoNewPrivileges: true,
			OOMScoreAdj:     &oomScoreAdj,
		},
		Root:     &specs.Root{Path: rootfs, Readonly: false},
		Hostname: hostname,
		Mounts:   mounts,
		Linux: &specs.Linux{
			CgroupsPath: cgroupPath(spec.ID),
			Resources:   res,
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				netns,
				{Type: specs.CgroupNamespace},
			},
			Seccomp:           seccompProfile(goruntime.GOARCH),
			MaskedPaths:       maskedPaths,
			ReadonlyPaths:     readonlyPaths,
			RootfsPropagation: "rprivate",
		},
	}
}

// agentOOMScoreAdj returns the oom_score_adj for guest agents: oomNever
// when this process may lower scores (CAP_SYS_RESOURCE), else its own,
// the lowest the runtime it starts can set.
func agentOOMScoreAdj() int {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err == nil && data[0].Effective&(1<<unix.CAP_SYS_RESOURCE) != 0 {
		return oomNever
	}
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return n
}

// tmpfsOptions are the options of a guest tmpfs with mode and more, of
// size bytes (rounded up to whole pages by the kernel) unless size is 0.
func tmpfsOptions(mode string, size uint64, more ...string) []string {
	opts := append([]string{"nosuid", "nodev", mode}, more...)
	if size > 0 {
		opts = append(opts, "size="+strconv.FormatUint(size, 10))
	}
	return opts
}

// devBytes bounds the guest's /dev.
const devBytes = 1 << 20

// executionsCgroup is the cgroup, below each hierarchy's root, that holds
// every execution's (those of all deployments on the host).
const executionsCgroup = "/kibotos"

// cgroupPath is the execution's cgroup below each hierarchy's root.
func cgroupPath(id string) string { return executionsCgroup + "/" + id }

// marshalSpec renders config.json.
func marshalSpec(s *specs.Spec) ([]byte, error) {
	return json.MarshalIndent(s, "", "  ")
}

// guestHostname is the hostname of the guest of spec: its own, or else
// the execution's ID.
func guestHostname(spec runtime.Spec) string {
	if spec.Hostname != "" {
		return spec.Hostname
	}
	return spec.ID
}

// writeIdentity writes the guest's /etc/hostname and /etc/hosts into its
// socket directory sockDir: the hostname, and it beside localhost on the
// loopback as Debian has it (127.0.1.1), so that a program that looks up
// its own name finds it without a DNS query.
func writeIdentity(sockDir, hostname string) error {
	hosts := "127.0.0.1\tlocalhost\n127.0.1.1\t" + hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	return errors.Join(
		os.WriteFile(filepath.Join(sockDir, hostnameName), []byte(hostname+"\n"), 0o644),
		os.WriteFile(filepath.Join(sockDir, hostsName), []byte(hosts), 0o644))
}
