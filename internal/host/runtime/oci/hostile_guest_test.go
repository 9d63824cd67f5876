package oci

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// linkInto makes the host files hostPaths part of layer, at the same
// paths, with links resolved, as hard links (the test's temporary directory and /usr share a
// filesystem here) or copies.
func linkInto(t testing.TB, layer string, hostPaths ...string) {
	t.Helper()
	for _, p := range hostPaths {
		dst := filepath.Join(layer, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		real, err := filepath.EvalSymlinks(p) // a file, not a link the layer cannot resolve
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Link(real, dst); err != nil && !errors.Is(err, os.ErrExist) {
			if out, err := exec.Command("cp", real, dst).CombinedOutput(); err != nil {
				t.Fatalf("cp %s: %v %s", p, err, out)
			}
		}
	}
}

// TestSeccompProbe: a program inside the guest tries the kernel
// interfaces the profile closes; every one is refused with EPERM (or
// ENOSYS for clone3, so that libc falls back to clone).
func TestSeccompProbe(t *testing.T) {
	e := newEnv(t)
	layer := filepath.Join(t.TempDir(), "probe")
	if err := testutil.Build(filepath.Join(layer, "usr", "bin", "seccompprobe"),
		"github.com/kibotos/kibotos/internal/host/runtime/oci/testdata/seccompprobe"); err != nil {
		t.Fatal(err)
	}
	e.layers = append(e.layers, layer)
	e.start(t, e.spec("probe", e.image(t)))
	out := e.exec(t, "probe", "/usr/bin/seccompprobe")
	refused, total := 0, 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		i := strings.LastIndexByte(sc.Text(), ' ')
		if i < 0 {
			continue
		}
		name, result := sc.Text()[:i], sc.Text()[i+1:]
		total++
		want := "EPERM"
		if name == "clone3" {
			want = "ENOSYS"
		}
		if result == want {
			refused++
		} else {
			t.Errorf("%s in the guest: %s, want %s", name, result, want)
		}
	}
	if total < 50 {
		t.Fatalf("the probe tried %d calls:\n%s", total, out)
	}
	t.Logf("%d of %d dangerous calls refused", refused, total)
}

// TestSeccompProfileArchitectures: the profile is an allowlist for the
// architecture the host runs alone (amd64 or arm64, none of their 32-bit
// modes), each with its own calls.
func TestSeccompProfileArchitectures(t *testing.T) {
	for _, tc := range []struct {
		goarch string
		arches string
		own    string
	}{
		{"amd64", "SCMP_ARCH_X86_64", "arch_prctl"},
		{"arm64", "SCMP_ARCH_AARCH64", "set_tls"},
	} {
		p := seccompProfile(tc.goarch)
		var arches []string
		for _, a := range p.Architectures {
			arches = append(arches, string(a))
		}
		if got := strings.Join(arches, " "); got != tc.arches {
			t.Errorf("%s: architectures %s, want %s", tc.goarch, got, tc.arches)
		}
		if p.DefaultAction != "SCMP_ACT_ERRNO" || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != 1 {
			t.Errorf("%s: default action %s, want ERRNO(EPERM)", tc.goarch, p.DefaultAction)
		}
		allowed := map[string]bool{}
		for _, r := range p.Syscalls {
			if r.Action == "SCMP_ACT_ALLOW" && len(r.Args) == 0 {
				for _, n := range r.Names {
					allowed[n] = true
				}
			}
		}
		if !allowed[tc.own] || !allowed["read"] {
			t.Errorf("%s: read and %s are not allowed", tc.goarch, tc.own)
		}
		for _, n := range []string{"unshare", "setns", "mount", "keyctl", "bpf", "io_uring_setup", "init_module", "ptrace"} {
			if allowed[n] != (n == "ptrace") {
				t.Errorf("%s: %s allowed = %v", tc.goarch, n, allowed[n])
			}
		}
	}
}

// TestHostPrograms: dynamically linked programs of the host (python3 and
// node, with their libraries) run under the profile: threads, child
// processes, sockets, pipes, timers, their event loops.
func TestHostPrograms(t *testing.T) {
	e := newEnv(t)
	var bins []string
	for _, b := range []string{"/usr/bin/python3.11", "/usr/bin/node"} {
		if _, err := os.Stat(b); err == nil {
			bins = append(bins, b)
		}
	}
	if len(bins) == 0 {
		t.Skip("needs /usr/bin/python3.11 or /usr/bin/node")
	}
	layer := filepath.Join(t.TempDir(), "programs")
	files := append([]string(nil), bins...)
	for _, b := range bins {
		out, err := exec.Command("ldd", b).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, "/") {
				files = append(files, f)
			}
		}
	}
	linkInto(t, layer, files...)
	if _, err := os.Stat("/usr/lib/python3.11"); err == nil {
		if err := os.MkdirAll(filepath.Join(layer, "usr", "lib"), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-al", "/usr/lib/python3.11", filepath.Join(layer, "usr", "lib", "python3.11")).CombinedOutput(); err != nil {
			t.Fatalf("cp -al: %v %s", err, out)
		}
	}
	e.layers = append(e.layers, layer)
	e.start(t, e.spec("progs", e.image(t)))
	for _, b := range bins {
		var script []string
		if strings.Contains(b, "python") {
			script = []string{b, "-c", `
import json, os, socket, subprocess, threading, time, tempfile, select, signal
out = subprocess.run(["/bin/sh", "-c", "echo child"], capture_output=True, text=True).stdout
t = threading.Thread(target=lambda: time.sleep(0.01)); t.start(); t.join()
a, b = socket.socketpair(); a.send(b"x"); assert b.recv(1) == b"x"
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); c = socket.create_connection(s.getsockname()); s.accept()
pid = os.fork()
if pid == 0: os._exit(7)
assert os.waitpid(pid, 0)[1] >> 8 == 7
with tempfile.NamedTemporaryFile() as f: f.write(b"x"); f.flush(); os.fsync(f.fileno())
print(json.dumps({"child": out.strip(), "ok": True}))`}
		} else {
			script = []string{b, "-e", `
const cp = require("child_process"), fs = require("fs"), net = require("net"), os = require("os");
const { Worker } = require("worker_threads");
const child = cp.execFileSync("/bin/sh", ["-c", "echo child"]).toString().trim();
fs.writeFileSync("/tmp/n.txt", "x"); fs.readFileSync("/tmp/n.txt");
new Worker("require('worker_threads').parentPort.postMessage(1)", { eval: true }).on("message", () => {
  const srv = net.createServer(c => c.end("y")).listen(0, "127.0.0.1", () => {
    net.connect(srv.address().port, "127.0.0.1").on("data", () => {
      fs.promises.readFile("/tmp/n.txt").then(() => { console.log(JSON.stringify({ child, ok: true, cpus: os.cpus().length > 0 })); process.exit(0); });
    });
  });
});`}
		}
		if out := e.exec(t, "progs", script...); !strings.Contains(out, `"child": "child", "ok": true`) && !strings.Contains(out, `"child":"child","ok":true`) {
			t.Errorf("%s in the guest: %q", filepath.Base(b), out)
		}
	}
}

// TestOOMSparesAgent: the guest agent is out of the OOM killer's reach,
// without CAP_SYS_PTRACE in its set, and /tmp and /run are bounded by a
// share of the memory limit: filling /tmp fails with ENOSPC, a process
// that eats memory dies, and the agent answers throughout.
func TestOOMSparesAgent(t *testing.T) {
	e := newEnv(t)
	spec := e.spec("oomagent", e.image(t))
	spec.MemoryBytes = 128 << 20
	e.start(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// -1000 where the host agent holds CAP_SYS_RESOURCE; without it, no
	// process can go below its own score.
	want := strconv.Itoa(agentOOMScoreAdj())
	if got := strings.TrimSpace(e.exec(t, "oomagent", "cat", "/proc/1/oom_score_adj")); got != want {
		t.Errorf("the agent's oom_score_adj = %s, want %s", got, want)
	}
	if want != strconv.Itoa(oomNever) {
		t.Logf("no CAP_SYS_RESOURCE here: the agent's oom_score_adj is %s, not %d", want, oomNever)
	}
	status := e.exec(t, "oomagent", "cat", "/proc/1/status")
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && (k == "CapBnd" || k == "CapEff" || k == "CapPrm") {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil || caps&(1<<19) != 0 { // CAP_SYS_PTRACE
				t.Errorf("%s of the agent = %s: CAP_SYS_PTRACE is in it", k, strings.TrimSpace(v))
			}
		}
	}
	for _, dir := range []string{"/tmp", "/run"} {
		// 25 % of 128 MiB.
		out := e.exec(t, "oomagent", "sh", "-c", "dd if=/dev/zero of="+dir+"/big bs=1M count=200 2>&1; echo rc=$?; rm -f "+dir+"/big")
		if !strings.Contains(out, "No space left on device") || !strings.Contains(out, "32+0 records out") {
			t.Errorf("writing 200 MiB to %s of a 128 MiB guest: %q, want ENOSPC at 32 MiB", dir, out)
		}
	}
	// tail keeps a line of /dev/zero, which has none, in memory.
	e.wantOOMKilled(ctx, t, "oomagent", "tail", "/dev/zero")
}

// TestConsoleLogBounded: what the guest writes to PID 1's standard
// output lands in a bounded log, not on the host's disk without limit,
// and the agent runs on.
func TestConsoleLogBounded(t *testing.T) {
	e := newEnv(t)
	e.start(t, e.spec("console", e.image(t)))
	out := e.exec(t, "console", "sh", "-c", "dd if=/dev/zero of=/proc/1/fd/1 bs=1M count=16 2>&1; echo rc=$?")
	if strings.Contains(out, "rc=0") {
		t.Errorf("16 MiB into PID 1's output: %q, want it cut short", out)
	}
	fi, err := os.Stat(consoleLog(e.d.dir("console")))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > consoleLogBytes {
		t.Errorf("the console log holds %d bytes, more than %d", fi.Size(), consoleLogBytes)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.d.Probe(ctx, "console"); err != nil {
		t.Fatalf("the agent after the flood: %v", err)
	}
}

// TestMaskedPaths: the host's firmware, power capping, loop devices (the
// other workspaces' disk images) and kernel internals are hidden from the
// guest, and the kernel's tunables are read-only, as in Docker.
func TestMaskedPaths(t *testing.T) {
	e := newEnv(t)
	e.start(t, e.spec("masked", e.image(t)))
	if out := e.exec(t, "masked", "sh", "-c", "cat /sys/block/loop*/loop/backing_file 2>/dev/null; true"); out != "" {
		t.Errorf("the guest reads the host's loop devices' backing files: %q", out)
	}
	for _, p := range []string{"/sys/firmware", "/sys/devices/virtual/powercap", "/sys/devices/virtual/block", "/proc/acpi", "/proc/scsi"} {
		if out := e.exec(t, "masked", "sh", "-c", "ls -A "+p+" 2>/dev/null | head -5"); out != "" {
			t.Errorf("%s lists %q in the guest", p, out)
		}
	}
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/interrupts", "/proc/sched_debug"} {
		if out := e.exec(t, "masked", "sh", "-c", "head -c 64 "+p+" 2>/dev/null; true"); out != "" {
			t.Errorf("%s reads %q in the guest", p, out)
		}
	}
	for _, p := range []string{"/proc/sys/kernel/hostname", "/proc/sys/kernel/domainname"} {
		if out := e.exec(t, "masked", "sh", "-c", "echo x > "+p+" 2>&1; echo rc=$?"); !strings.Contains(out, "Read-only file system") {
			t.Errorf("writing %s in the guest: %q, want read-only", p, out)
		}
	}
}

// TestHostTasksBounded: every execution's tasks count against one
// cgroup whose limit leaves the host a reserve of its task IDs, so guests
// that fork without end cannot take them all.
func TestHostTasksBounded(t *testing.T) {
	e := newEnv(t)
	e.start(t, e.spec("forkbound", e.image(t)))
	limit, err := hostTaskLimit()
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := executionsPidsCgroup()
	if got, err := readValue(filepath.Join(dir, "pids.max")); err != nil || got > limit {
		t.Errorf("pids.max of %s: %d (%v), want at most %d", dir, got, err, limit)
	}
	if _, err := os.Stat(filepath.Join(dir, "forkbound")); err != nil {
		t.Errorf("the execution's cgroup is not below %s: %v", dir, err)
	}
	if n, err := readValue(filepath.Join(dir, "pids.current")); err != nil || n == 0 {
		t.Errorf("pids.current of %s: %d (%v), want the execution's tasks", dir, n, err)
	}
}

func TestTasksLeftToExecutions(t *testing.T) {
	for _, c := range []struct{ total, want uint64 }{
		{32768, 28672},     // an eighth kept
		{4194304, 3670016}, // systemd's pid_max
		{4096, 3072},       // minHostTaskReserve kept
		{1500, 750},        // never more than half
	} {
		if got := tasksLeftToExecutions(c.total); got != c.want {
			t.Errorf("tasksLeftToExecutions(%d) = %d, want %d", c.total, got, c.want)
		}
	}
}

// TestVolumeOverGuestSymlink: a link the guest left at the volume's mount
// path, even one to the agent's socket directory, is replaced by the
// volume; it is not followed, and the guest starts. A link on the way
// to it fails the start at once. Links at or on the way to the
// platform's own mount points are replaced.
func TestVolumeOverGuestSymlink(t *testing.T) {
	e := newEnv(t)
	img, vol := e.image(t), e.volume(t, "v")
	plain := e.spec("link", img)
	e.start(t, plain)
	e.exec(t, "link", "sh", "-c", "ln -s /run/kibotos /data && mkdir -p /srv && ln -s ../etc /srv/data && ln -s /nowhere /dangling && ln -s /run /opt"+
		" && mv /.kibotos /.k && ln -s /tmp /.kibotos")
	e.stop(t, plain, runtime.StopNormal)

	// A link on the way to the mount point: refused at once, nothing set up.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec := e.spec("link", img)
	spec.Volume = &runtime.VolumeMount{Image: vol, Path: "/opt/kibotos"}
	if err := e.d.Start(ctx, spec); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("Start with a link on the way to the volume: %v", err)
	}
	e.assertReleased(t, "link", img)

	for _, path := range []string{"/data", "/srv/data", "/dangling"} {
		spec := e.spec("link", img)
		spec.Volume = &runtime.VolumeMount{Image: vol, Path: path}
		e.start(t, spec)
		out := e.exec(t, "link", "sh", "-c", "echo v > "+path+"/v.txt && grep ' "+path+" ' /proc/mounts && ls /run/kibotos /etc")
		if !strings.Contains(out, "ext4") || strings.Contains(out, "v.txt") {
			t.Errorf("volume at the guest's link %s: %q", path, out)
		}
		e.stop(t, spec, runtime.StopNormal)
	}
}

// TestErrorsNameNoHostPath: errors of the driver that reach callers
// name no host path of the driver's state directory or images.
func TestErrorsNameNoHostPath(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	img := e.image(t)
	e.start(t, e.spec("busy", img))
	bad := []runtime.Spec{e.spec("busy2", img)} // the image is in use
	missing := e.spec("nolayer", filepath.Join(e.state, "missing.img"))
	bad = append(bad, missing)
	withVol := e.spec("vol", e.namedImage(t, "ws2.img"))
	withVol.Volume = &runtime.VolumeMount{Image: img, Path: "/data"} // in use as a layer
	bad = append(bad, withVol)
	for _, spec := range bad {
		err := e.d.Start(ctx, spec)
		if err == nil {
			t.Fatalf("Start(%s) succeeded", spec.ID)
		}
		if strings.Contains(err.Error(), e.state) || strings.Contains(err.Error(), "/tmp/") {
			t.Errorf("Start(%s): %q names a host path", spec.ID, err)
		}
	}
	if _, err := e.d.DialGuest(ctx, "busy", "nosuch"); err == nil || strings.Contains(err.Error(), e.state) {
		t.Errorf("DialGuest of a missing socket: %v", err)
	}
}

// TestNoDescriptorLeak: start and stop cycles leave the driver's process
// no more descriptors than before (eventfds, pidfds, files).
func TestNoDescriptorLeak(t *testing.T) {
	e := newEnv(t)
	img := e.image(t)
	count := func() map[string]int {
		n := map[string]int{}
		ents, _ := os.ReadDir("/proc/self/fd")
		for _, ent := range ents {
			target, err := os.Readlink(filepath.Join("/proc/self/fd", ent.Name()))
			if err != nil {
				continue
			}
			if strings.HasPrefix(target, "/") {
				target = "file"
			} else if i := strings.IndexAny(target, ":["); i > 0 && !strings.HasPrefix(target, "anon_inode") {
				target = target[:i]
			}
			n[target]++
		}
		return n
	}
	// Each cycle has an execution ID of its own, as the host's have.
	cycle := func(id string) {
		spec := e.spec(id, img)
		e.start(t, spec)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		e.d.Status(ctx, id)
		e.d.CheckGuest(ctx, id) // keeps a connection until the stop
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
		e.d.Wait(ctx, id) // ends with ctx: it runs
		cancel()
		e.stop(t, spec, runtime.StopNormal)
	}
	cycle("fds") // the first start opens what the process keeps (the runtime's pipes, ...)
	before := count()
	for i := range 5 {
		cycle(fmt.Sprintf("fds%d", i))
	}
	after := count()
	for k, v := range after {
		if v > before[k] {
			t.Errorf("%d more %s descriptors after 5 cycles (%d → %d)", v-before[k], k, before[k], v)
		}
	}
}

// TestGuestTmpfsPercent: the share of memory for /tmp, /run and /dev/shm
// is within 1 to 100 percent and sizes all three; /dev holds 1 MiB.
func TestGuestTmpfsPercent(t *testing.T) {
	hosttest.RequireContainers(t)
	for _, pct := range []int{-1, 101} {
		if _, err := New(Config{StateDir: t.TempDir(), GuestTmpfsPercent: pct}); err == nil {
			t.Errorf("New accepted a guest tmpfs share of %d%%", pct)
		}
	}
	d, err := New(Config{StateDir: t.TempDir(), GuestTmpfsPercent: 50})
	if err != nil {
		t.Fatal(err)
	}
	spec := runtime.Spec{ID: "x", MemoryBytes: 256 << 20, GuestAgent: "/agent"}
	s := ociSpec(spec, "/rootfs", "/sock", "", d.tmpfsBytes(spec.MemoryBytes), 0)
	for _, m := range s.Mounts {
		want := map[string]string{"/tmp": "size=134217728", "/run": "size=134217728", "/dev/shm": "size=134217728", "/dev": "size=1048576"}[m.Destination]
		if want != "" && !strings.Contains(strings.Join(m.Options, ","), want) {
			t.Errorf("%s options %v, want %s", m.Destination, m.Options, want)
		}
	}
}

// TestGuestDevTmpfsBounded: what a guest writes to /dev and /dev/shm, which
// counts against its memory, stops at their sizes (1 MiB, a quarter of
// its memory), and the guest goes on: at 64 MiB each they could take all
// of a small guest's memory, its agent's included.
func TestGuestDevTmpfsBounded(t *testing.T) {
	e := newEnv(t)
	spec := e.spec("devfull", e.image(t))
	e.start(t, spec)
	out := e.exec(t, "devfull", "sh", "-c", `dd if=/dev/zero of=/dev/big bs=64k count=64 2>/dev/null && echo dev wrote all
dd if=/dev/zero of=/dev/shm/big bs=1M count=200 2>/dev/null && echo shm wrote all
rm -f /dev/big /dev/shm/big; df -k /dev/shm | tail -1 | awk '{print "shm", $2}'`)
	if out != "shm 65536\n" {
		t.Errorf("writing 4 MiB to /dev and 200 MiB to /dev/shm in a guest of 256 MiB: %q, want both refused and /dev/shm of 64 MiB", out)
	}
	if _, err := e.d.Exec(context.Background(), "devfull", "true"); err != nil {
		t.Errorf("the guest after: %v", err)
	}
}

// int80Program is a static amd64 program that makes the 32-bit system
// call getpid (int 0x80, eax 20) and exits with its result: the guest's
// PID when the call goes through.
func int80Program() []byte {
	code := []byte{
		0xb8, 0x14, 0x00, 0x00, 0x00, // mov eax, 20 (getpid of the i386 ABI)
		0xcd, 0x80, // int 0x80
		0x89, 0xc7, // mov edi, eax
		0xb8, 0x3c, 0x00, 0x00, 0x00, // mov eax, 60 (exit)
		0x0f, 0x05, // syscall
	}
	const base, headers = 0x400000, 64 + 56
	var b bytes.Buffer
	le := binary.LittleEndian
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	binary.Write(&b, le, struct {
		Type, Machine                                     uint16
		Version                                           uint32
		Entry, Phoff, Shoff                               uint64
		Flags                                             uint32
		Ehsize, Phentsize, Phnum, Shentsize, Shnum, Shstr uint16
	}{2, 62, 1, base + headers, 64, 0, 0, 64, 56, 1, 0, 0, 0})
	binary.Write(&b, le, struct {
		Type, Flags                                uint32
		Offset, Vaddr, Paddr, Filesz, Memsz, Align uint64
	}{1, 5, 0, base, base, headers + uint64(len(code)), headers + uint64(len(code)), 0x1000})
	b.Write(code)
	return b.Bytes()
}

// TestSeccompRefusesCompatCalls: a system call of the 32-bit ABI made by
// a guest program does not reach the kernel: the program dies of it or
// gets an error, never its PID.
func TestSeccompRefusesCompatCalls(t *testing.T) {
	e := newEnv(t)
	layer := filepath.Join(t.TempDir(), "int80")
	if err := os.MkdirAll(filepath.Join(layer, "usr", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layer, "usr", "bin", "int80"), int80Program(), 0o755); err != nil {
		t.Fatal(err)
	}
	e.layers = append(e.layers, layer)
	e.start(t, e.spec("int80", e.image(t)))
	out := e.exec(t, "int80", "sh", "-c", "/usr/bin/int80 & pid=$!; wait $pid; echo rc=$? pid=$pid")
	var rc, pid int
	if _, err := fmt.Sscanf(strings.TrimSpace(out[strings.LastIndex(out, "rc="):]), "rc=%d pid=%d", &rc, &pid); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	if rc == pid&0xff {
		t.Fatalf("the 32-bit getpid went through: exit %d, pid %d", rc, pid)
	}
	t.Logf("the 32-bit call ended the program with %d", rc)
}
