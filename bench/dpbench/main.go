// Command dpbench measures the data plane of a running `kibotos up`
// through the Go SDK: the round trip of exec `true` (p50, p99), file write
// and read throughput, and create→first exec output side by side with a
// bare `runc run` of the same rootfs printing the same line.
//
//	go run ./bench/dpbench -addr 127.0.0.1:8870 -home /var/lib/kibotos
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"os"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	"github.com/kibotos/kibotos/sdk"
)

func main() {
	addr, home := benchutil.DeploymentFlags()
	execs := flag.Int("execs", 200, "exec round trips to time")
	fileMiB := flag.Int("file-mib", 512, "size of the file written and read, in MiB")
	creates := flag.Int("creates", 20, "workspaces to create for create→first output")
	flag.Parse()
	if err := run(*addr, *home, *execs, *fileMiB, *creates); err != nil {
		fmt.Fprintln(os.Stderr, "dpbench:", err)
		os.Exit(1)
	}
}

func run(addr, home string, execs, fileMiB, creates int) error {
	token, err := benchutil.AdminToken(home)
	if err != nil {
		return err
	}
	client := sdk.New("http://"+addr, token)
	defer client.Close()
	ctx := context.Background()

	ws, err := client.CreateWorkspace(ctx, sdk.CreateOptions{MemoryBytes: 512 << 20, DiskBytes: uint64(fileMiB+256) << 20})
	if err != nil {
		return err
	}
	defer client.DeleteWorkspace(ctx, ws.ID())

	// Exec round trip of `true`, after one warm-up call issues the session.
	if _, err := ws.Exec(ctx, []string{"true"}, sdk.ExecOptions{}); err != nil {
		return err
	}
	var rtt []time.Duration
	for range execs {
		start := time.Now()
		st, err := ws.Exec(ctx, []string{"true"}, sdk.ExecOptions{})
		if err != nil || !st.Success() {
			return fmt.Errorf("exec true: %v %v", st, err)
		}
		rtt = append(rtt, time.Since(start))
	}
	benchutil.Report("exec true round trip", rtt)

	size := int64(fileMiB) << 20
	start := time.Now()
	if _, err := ws.Upload(ctx, io.LimitReader(mathrand.NewChaCha8([32]byte{7}), size), "/root/bench", 0o644); err != nil {
		return err
	}
	write := time.Since(start)
	start = time.Now()
	if _, err := ws.Download(ctx, "/root/bench", io.Discard); err != nil {
		return err
	}
	read := time.Since(start)
	fmt.Printf("file write %d MiB: %.0f MiB/s; read: %.0f MiB/s\n", fileMiB,
		float64(fileMiB)/write.Seconds(), float64(fileMiB)/read.Seconds())

	var first []time.Duration
	for range creates {
		start := time.Now()
		w, err := client.CreateWorkspace(ctx, sdk.CreateOptions{MemoryBytes: 128 << 20, DiskBytes: 64 << 20})
		if err != nil {
			return err
		}
		var out bytes.Buffer
		if _, err := w.Exec(ctx, []string{"echo", "ready"}, sdk.ExecOptions{Stdout: &out}); err != nil || out.String() != "ready\n" {
			return fmt.Errorf("first exec: %q %v", out.String(), err)
		}
		first = append(first, time.Since(start))
		if err := client.DeleteWorkspace(ctx, w.ID()); err != nil {
			return err
		}
	}
	rootfs, err := benchutil.BaseRootfs(home)
	if err != nil {
		return err
	}
	bare, err := benchutil.BareRunc(rootfs, creates, "/bin/echo", "ready")
	if err != nil {
		return err
	}
	benchutil.Report("create→first exec output", first)
	benchutil.Report("bare runc run echo", bare)
	return nil
}
