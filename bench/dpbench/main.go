// Command dpbench measures the data plane of a running `kibotos up`
// through the Go SDK, each figure beside a baseline measured in the same
// run: the round trip of exec `true` (p50, p99) beside a Connect unary
// call on loopback, and beside a bare spawn and wait of the guest's
// `true` on the host, the floor under it on this machine; exec `true` per
// second with 1 and with -callers parallel callers on one workspace; a
// short command after idling in a workspace of 0.1 CPU beside the same in
// one of the default CPU; `kibotos ws exec WS -- true` end to end beside
// the SDK's round trip, and its CPU beside the SDK client's per exec; the
// CLI's start (`kibotos version`) beside that of kibotos-server, the whole
// binary, when it lies next to -cli; and file write and read throughput
// beside `dd` of the same size on the host's disk. Create→first output is
// bench/wsbench's.
//
//	go run ./bench/dpbench -addr 127.0.0.1:8870 -home /var/lib/kibotos -cli bin/kibotos
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/sdk"
)

type config struct {
	addr, home, cli string
	execs, callers  int
	window          time.Duration
	cliRuns         int
	fileMiB         int
	memoryMiB       int
	pid             int
	idleIters       int
	idleRuns        int
}

func main() {
	var c config
	addr, home := benchutil.DeploymentFlags()
	flag.IntVar(&c.execs, "execs", 200, "exec round trips to time")
	flag.IntVar(&c.callers, "callers", 20, "parallel callers for the exec throughput")
	flag.DurationVar(&c.window, "window", 5*time.Second, "how long each exec throughput runs")
	flag.StringVar(&c.cli, "cli", "bin/kibotos", "the kibotos binary whose `ws exec` is timed; empty skips it")
	flag.IntVar(&c.cliRuns, "cli-runs", 30, "`ws exec` runs to time")
	flag.IntVar(&c.fileMiB, "file-mib", 1024, "size of the file written and read, in MiB; 0 skips it")
	flag.IntVar(&c.memoryMiB, "memory-mib", 512, "memory of the workspace the file is written in, in MiB")
	flag.IntVar(&c.pid, "pid", 0, "pid of kibotos up, whose CPU per exec is reported; 0 leaves it out")
	flag.IntVar(&c.idleIters, "idle-iters", 15000, "steps of the shell loop timed after idling in a workspace of 0.1 CPU (about a µs of CPU each); 0 skips it")
	flag.IntVar(&c.idleRuns, "idle-runs", 20, "runs of that loop to time; 0 skips it")
	benchutil.Main("dpbench", func() error {
		c.addr, c.home = *addr, *home
		return run(c)
	})
}

// row prints a figure beside its baseline and their ratio.
func row(name string, v, base float64, unit string) {
	fmt.Printf("%-40s %10.2f %-6s baseline %10.2f %-6s ratio %.2f\n", name, v, unit, base, unit, v/base)
}

func run(c config) error {
	if c.execs < 1 || c.callers < 1 || c.cli != "" && c.cliRuns < 1 {
		return fmt.Errorf("-execs, -callers and -cli-runs must be at least 1")
	}
	token, err := benchutil.AdminToken(c.home)
	if err != nil {
		return err
	}
	client := sdk.New("http://"+c.addr, token)
	defer client.Close()
	ctx := context.Background()

	ws, err := client.CreateWorkspace(ctx, sdk.CreateOptions{MemoryBytes: uint64(c.memoryMiB) << 20, DiskBytes: uint64(c.fileMiB+256) << 20})
	if err != nil {
		return err
	}
	defer client.DeleteWorkspace(ctx, ws.ID())

	// Exec round trip of `true`, after one warm-up call issues the session.
	if _, err := ws.Exec(ctx, []string{"true"}, sdk.ExecOptions{}); err != nil {
		return err
	}
	rtt, err := timeExecs(ctx, ws, c.execs)
	if err != nil {
		return err
	}
	unary, err := loopbackUnary(ctx, c.execs)
	if err != nil {
		return err
	}
	row("exec true round trip p50 (ms)", benchutil.Millis(benchutil.Quantile(rtt, 0.5)), benchutil.Millis(benchutil.Quantile(unary, 0.5)), "ms")
	row("exec true round trip p99 (ms)", benchutil.Millis(benchutil.Quantile(rtt, 0.99)), benchutil.Millis(benchutil.Quantile(unary, 0.99)), "ms")
	bare, err := bareSpawns(c.home, c.execs)
	if err != nil {
		return err
	}
	row("exec true p50 (ms), vs a bare spawn", benchutil.Millis(benchutil.Quantile(rtt, 0.5)), benchutil.Millis(benchutil.Quantile(bare, 0.5)), "ms")
	row("exec true p99 (ms), vs a bare spawn", benchutil.Millis(benchutil.Quantile(rtt, 0.99)), benchutil.Millis(benchutil.Quantile(bare, 0.99)), "ms")
	sock, err := benchutil.GuestSocket(c.home, ws.ID())
	if err != nil {
		return err
	}
	direct, err := guestExecs(ctx, sock, c.execs)
	if err != nil {
		return err
	}
	row("exec true p50 (ms), vs the guest's socket", benchutil.Millis(benchutil.Quantile(rtt, 0.5)), benchutil.Millis(benchutil.Quantile(direct, 0.5)), "ms")
	row("exec true p99 (ms), vs the guest's socket", benchutil.Millis(benchutil.Quantile(rtt, 0.99)), benchutil.Millis(benchutil.Quantile(direct, 0.99)), "ms")

	one, _, err := execRate(ctx, ws, c.home, 1, c.window, c.pid)
	if err != nil {
		return err
	}
	many, cpu, err := execRate(ctx, ws, c.home, c.callers, c.window, c.pid)
	if err != nil {
		return err
	}
	row("exec true/s, 1 caller", one, one, "/s")
	row(fmt.Sprintf("exec true/s, %d callers", c.callers), many, one, "/s")
	fmt.Printf("CPU per exec with %d callers: kibotos up %.2f ms, guest (agent and true) %.2f ms, SDK client %.2f ms\n",
		c.callers, benchutil.Millis(cpu.host), benchutil.Millis(cpu.guest), benchutil.Millis(cpu.client))

	if c.idleIters > 0 && c.idleRuns > 0 {
		if err := idleCommand(ctx, client, ws, c.idleIters, c.idleRuns); err != nil {
			return err
		}
	}

	if c.cli != "" {
		cli, cliCPU, err := timeCLI(c, ws.ID())
		if err != nil {
			return err
		}
		row("ws exec -- true p50 (ms), vs SDK p50", benchutil.Millis(benchutil.Quantile(cli, 0.5)), benchutil.Millis(benchutil.Quantile(rtt, 0.5)), "ms")
		row("ws exec -- true p99 (ms), vs SDK p99", benchutil.Millis(benchutil.Quantile(cli, 0.99)), benchutil.Millis(benchutil.Quantile(rtt, 0.99)), "ms")
		row("ws exec -- true CPU (ms), vs SDK per exec", benchutil.Millis(cliCPU), benchutil.Millis(cpu.client), "ms")
		if err := startCPU(c); err != nil {
			return err
		}
		saved, err := timeNewSession(ctx, client, ws.ID(), c.cliRuns)
		if err != nil {
			return err
		}
		row("GetWorkspace+IssueSession p50 (ms), vs SDK", benchutil.Millis(benchutil.Quantile(saved, 0.5)), benchutil.Millis(benchutil.Quantile(rtt, 0.5)), "ms")
	}

	if c.fileMiB > 0 {
		if err := files(ctx, ws, c); err != nil {
			return err
		}
	}
	return nil
}

// timeExecs times n sequential exec `true`.
func timeExecs(ctx context.Context, ws *sdk.Workspace, n int) ([]time.Duration, error) {
	var rtt []time.Duration
	for range n {
		start := time.Now()
		st, err := ws.Exec(ctx, []string{"true"}, sdk.ExecOptions{})
		if err != nil || !st.Success() {
			return nil, fmt.Errorf("exec true: %v %v", st, err)
		}
		rtt = append(rtt, time.Since(start))
	}
	return rtt, nil
}

// guestExecs times n StartProcess calls of `true`, to the end of their
// streams, made straight to the guest agent's data socket at path, as the
// host's gateway makes them (HTTP/2 on the unix socket): the round trip
// without the SDK's hop to the gateway and the gateway's own.
func guestExecs(ctx context.Context, path string, n int) ([]time.Duration, error) {
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	hc := &http.Client{Transport: &http.Transport{
		Protocols: &protocols,
		HTTP2:     guestabi.DataSocketHTTP2(),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}}
	defer hc.CloseIdleConnections()
	procs := datav1connect.NewProcessServiceClient(hc, "http://guest", connect.WithAcceptCompression("gzip", nil, nil))
	var out []time.Duration
	for i := range n + 1 { // the first opens the connection
		start := time.Now()
		stream, err := procs.StartProcess(ctx, connect.NewRequest(&datav1.StartProcessRequest{Args: []string{"true"}}))
		if err != nil {
			return nil, fmt.Errorf("StartProcess at the guest's socket: %w", err)
		}
		exited := false
		for stream.Receive() {
			exited = exited || stream.Msg().GetExited() != nil
		}
		if err := errors.Join(stream.Err(), stream.Close()); err != nil || !exited {
			return nil, fmt.Errorf("StartProcess at the guest's socket: exited %v, %v", exited, err)
		}
		if i > 0 {
			out = append(out, time.Since(start))
		}
	}
	return out, nil
}

// loopbackUnary times n Connect unary calls (grpc.health.v1 Check) to a
// server in this process on loopback, over h2c as the SDK speaks.
func loopbackUnary(ctx context.Context, n int) ([]time.Duration, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(grpchealth.NewHandler(grpchealth.NewStaticChecker()))
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: mux, Protocols: &protocols}
	go srv.Serve(ln)
	defer srv.Close()
	hc := sdk.NewHTTPClient(nil)
	defer hc.CloseIdleConnections()
	health := grpchealth.NewClient(hc, "http://"+ln.Addr().String())
	var out []time.Duration
	for i := range n + 1 {
		start := time.Now()
		if _, err := health.Check(ctx, &grpchealth.CheckRequest{}); err != nil {
			return nil, err
		}
		if i > 0 { // the first dials
			out = append(out, time.Since(start))
		}
	}
	return out, nil
}

// bareSpawns times n spawns and waits of the guest's `true` (the built-in
// template's busybox) on the host, with no runtime, agent or transport:
// what the process alone costs on this machine. The spawn is Go's, a
// vfork-style clone, as the guest agent's is.
func bareSpawns(home string, n int) ([]time.Duration, error) {
	rootfs, err := benchutil.BaseRootfs(home)
	if err != nil {
		return nil, err
	}
	busybox := filepath.Join(rootfs, "bin", "busybox")
	attr := &syscall.ProcAttr{Files: []uintptr{0, 1, 2}}
	var out []time.Duration
	for i := range n + 1 {
		start := time.Now()
		pid, err := syscall.ForkExec(busybox, []string{"true"}, attr)
		if err != nil {
			return nil, err
		}
		var status syscall.WaitStatus
		if _, err := syscall.Wait4(pid, &status, 0, nil); err != nil {
			return nil, err
		}
		if !status.Exited() || status.ExitStatus() != 0 {
			return nil, fmt.Errorf("%s true: %v", busybox, status)
		}
		if i > 0 { // the first reads the binary from the disk
			out = append(out, time.Since(start))
		}
	}
	return out, nil
}

// execCPU is the CPU time per exec: of kibotos up (0 without its pid),
// of the workspace's cgroup, and of this process.
type execCPU struct {
	host, guest, client time.Duration
}

// cpuNow reads the CPU times execCPU is made of, so far.
func cpuNow(ws *sdk.Workspace, home string, pid int) execCPU {
	var c execCPU
	if pid > 0 {
		c.host, _ = benchutil.ProcessCPU(pid)
	}
	c.guest = time.Duration(benchutil.CgroupSum(home, []string{ws.ID()}, "cpuacct", "cpuacct.usage"))
	c.client, _ = benchutil.ProcessCPU(os.Getpid())
	return c
}

// execRate runs exec `true` from callers goroutines for window and
// returns the completed execs per second and the CPU each cost.
func execRate(ctx context.Context, ws *sdk.Workspace, home string, callers int, window time.Duration, pid int) (float64, execCPU, error) {
	before := cpuNow(ws, home, pid)
	var done atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	deadline := time.Now().Add(window)
	start := time.Now()
	for range callers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				st, err := ws.Exec(ctx, []string{"true"}, sdk.ExecOptions{})
				if err == nil && !st.Success() {
					err = fmt.Errorf("exec true: %v", st)
				}
				if err != nil {
					mu.Lock()
					first = cmpOr(first, err)
					mu.Unlock()
					return
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	rate := float64(done.Load()) / time.Since(start).Seconds()
	after := cpuNow(ws, home, pid)
	n := time.Duration(max(done.Load(), 1))
	return rate, execCPU{(after.host - before.host) / n, (after.guest - before.guest) / n, (after.client - before.client) / n}, first
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// timeNewSession times what a `ws exec` without a cached session does
// before its exec: GetWorkspace, then IssueSession.
func timeNewSession(ctx context.Context, client *sdk.Client, id string, n int) ([]time.Duration, error) {
	var out []time.Duration
	for range n {
		start := time.Now()
		w, err := client.Workspace(ctx, id)
		if err != nil {
			return nil, err
		}
		if _, err := w.Session(ctx); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// timeCLI times `kibotos ws exec ID -- true` from a new process, after
// one warm-up run, and returns the CPU time a run took on average.
func timeCLI(c config, id string) ([]time.Duration, time.Duration, error) {
	var out []time.Duration
	var cpu time.Duration
	for i := range c.cliRuns + 1 {
		cmd := exec.Command(c.cli, "ws", "exec", "--addr", c.addr, "--home", c.home, id, "--", "true")
		start := time.Now()
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, 0, fmt.Errorf("%s: %v %s", strings.Join(cmd.Args, " "), err, b)
		}
		if i > 0 {
			out = append(out, time.Since(start))
			cpu += processCPU(cmd)
		}
	}
	return out, cpu / time.Duration(c.cliRuns), nil
}

// startCPU prints the CPU time of starting the CLI (`kibotos version`)
// beside that of the whole binary, kibotos-server next to it, whose
// package initialisation includes the server's.
func startCPU(c config) error {
	server := filepath.Join(filepath.Dir(c.cli), "kibotos-server")
	if _, err := os.Stat(server); err != nil {
		return nil // a tree with one binary
	}
	mean := func(bin string) (time.Duration, error) {
		var cpu time.Duration
		for range c.cliRuns {
			cmd := exec.Command(bin, "version")
			if b, err := cmd.CombinedOutput(); err != nil {
				return 0, fmt.Errorf("%s version: %v %s", bin, err, b)
			}
			cpu += processCPU(cmd)
		}
		return cpu / time.Duration(c.cliRuns), nil
	}
	cli, err := mean(c.cli)
	if err != nil {
		return err
	}
	whole, err := mean(server)
	if err != nil {
		return err
	}
	row("CLI start CPU (ms), vs kibotos-server", benchutil.Millis(cli), benchutil.Millis(whole), "ms")
	return nil
}

// processCPU is the user and system time of cmd's process, which ended.
func processCPU(cmd *exec.Cmd) time.Duration {
	return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// files writes and reads a file of c.fileMiB through the data plane, and
// the same file with dd on the host's disk (in c.home), its data synced
// at the end, as an upload syncs its file before renaming it into place.
// Both read the source file from the page cache. The file is uploaded
// once more from a stream of unknown length, which goes chunked.
func files(ctx context.Context, ws *sdk.Workspace, c config) error {
	size := int64(c.fileMiB) << 20
	block := make([]byte, 64<<20)
	rng := mathrand.NewChaCha8([32]byte{7})
	rng.Read(block)
	src := filepath.Join(c.home, "dpbench-src")
	defer os.Remove(src)
	if err := writeFile(src, io.LimitReader(&repeat{block: block}, size)); err != nil {
		return err
	}
	write, writeCPU, err := filePhase(ws, c, func() error {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = ws.Upload(ctx, f, "/root/bench", 0o644)
		return err
	})
	if err != nil {
		return err
	}
	read, readCPU, err := filePhase(ws, c, func() error {
		n, err := ws.Download(ctx, "/root/bench", io.Discard)
		if err == nil && n != size {
			err = fmt.Errorf("download: %d bytes, want %d", n, size)
		}
		return err
	})
	if err != nil {
		return err
	}
	if _, err := ws.Exec(ctx, []string{"rm", "/root/bench"}, sdk.ExecOptions{}); err != nil {
		return err
	}
	stream, _, err := filePhase(ws, c, func() error {
		_, err := ws.Upload(ctx, io.LimitReader(&repeat{block: block}, size), "/root/bench", 0o644)
		return err
	})
	if err != nil {
		return err
	}

	ddFile := filepath.Join(c.home, "dpbench-dd")
	defer os.Remove(ddFile)
	ddWrite, err := dd("if="+src, "of="+ddFile, "bs=1M", "conv=fsync")
	if err != nil {
		return err
	}
	ddRead, err := dd("if="+ddFile, "of=/dev/null", "bs=1M")
	if err != nil {
		return err
	}
	mib := float64(c.fileMiB)
	row(fmt.Sprintf("file write %d MiB (MiB/s), vs dd", c.fileMiB), mib/write.Seconds(), mib/ddWrite.Seconds(), "MiB/s")
	row(fmt.Sprintf("file read %d MiB (MiB/s), vs dd", c.fileMiB), mib/read.Seconds(), mib/ddRead.Seconds(), "MiB/s")
	row(fmt.Sprintf("file write %d MiB, unknown length (MiB/s), vs dd", c.fileMiB), mib/stream.Seconds(), mib/ddWrite.Seconds(), "MiB/s")
	gib := float64(size) / (1 << 30)
	for _, p := range []struct {
		name string
		cpu  fileCPU
	}{{"write", writeCPU}, {"read", readCPU}} {
		fmt.Printf("CPU s per GiB of the file %s: kibotos up %.2f, guest %.2f, SDK client %.2f, machine busy %.2f\n", p.name,
			p.cpu.host.Seconds()/gib, p.cpu.guest.Seconds()/gib, p.cpu.client.Seconds()/gib, p.cpu.machine.Seconds()/gib)
	}
	return nil
}

// writeFile writes r to a new file at path and syncs it, so that its
// writeback is not on the disk beside what is timed next.
func writeFile(path string, r io.Reader) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// fileCPU is the CPU time of a file phase: execCPU's and the machine's
// busy time (which holds the kernel's writeback of the workspace's disk).
type fileCPU struct {
	execCPU
	machine time.Duration
}

// filePhase runs f and returns how long it took and the CPU it cost.
func filePhase(ws *sdk.Workspace, c config, f func() error) (time.Duration, fileCPU, error) {
	before, busyBefore := cpuNow(ws, c.home, c.pid), machineBusy()
	start := time.Now()
	err := f()
	took := time.Since(start)
	after, busyAfter := cpuNow(ws, c.home, c.pid), machineBusy()
	return took, fileCPU{execCPU{after.host - before.host, after.guest - before.guest, after.client - before.client}, busyAfter - busyBefore}, err
}

// machineBusy is benchutil.MachineBusy, 0 where /proc/stat cannot be read.
func machineBusy() time.Duration {
	d, _ := benchutil.MachineBusy()
	return d
}

// dd runs dd with args and returns how long it took.
func dd(args ...string) (time.Duration, error) {
	start := time.Now()
	if b, err := exec.Command("dd", args...).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("dd %s: %v %s", strings.Join(args, " "), err, b)
	}
	return time.Since(start), nil
}

// repeat reads block over and over.
type repeat struct {
	block []byte
	off   int
}

func (r *repeat) Read(p []byte) (int, error) {
	n := copy(p, r.block[r.off:])
	r.off = (r.off + n) % len(r.block)
	return n, nil
}
