// Command wsbench measures, against a running `kibotos up`, how long a
// workspace takes from CreateWorkspace to AVAILABLE (p50, p99 over -n
// workspaces) side by side with a bare `runc run` of the same rootfs, and
// how much host memory each idle workspace costs.
//
//	go run ./bench/wsbench -addr 127.0.0.1:8870 -home /var/lib/kibotos -n 50
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/bearer"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8870", "address of kibotos up")
	home := flag.String("home", "/var/lib/kibotos", "its home directory (admin token, template layers)")
	n := flag.Int("n", 50, "workspaces to create")
	flag.Parse()
	if err := run(*addr, *home, *n); err != nil {
		fmt.Fprintln(os.Stderr, "wsbench:", err)
		os.Exit(1)
	}
}

func run(addr, home string, n int) error {
	token, err := os.ReadFile(filepath.Join(home, "admin-token"))
	if err != nil {
		return err
	}
	client := ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, "http://"+addr, connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token)))))
	ctx := context.Background()

	before, err := memAvailable()
	if err != nil {
		return err
	}
	var latencies []time.Duration
	var ids []string
	defer func() {
		for _, id := range ids {
			client.DeleteWorkspace(ctx, connect.NewRequest(&ctrlv1.DeleteWorkspaceRequest{
				Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, WorkspaceId: id}))
		}
	}()
	for range n {
		start := time.Now()
		resp, err := client.CreateWorkspace(ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{
			Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
			Spec: &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{
				CpuMillis: 100, MemoryBytes: 128 << 20, WritableLayerBytes: 64 << 20}},
		}))
		if err != nil {
			return err
		}
		id := resp.Msg.Workspace.WorkspaceId
		ids = append(ids, id)
		for {
			got, err := client.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
			if err != nil {
				return err
			}
			if s := got.Msg.Workspace.State; s == ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE {
				break
			} else if s == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED {
				return fmt.Errorf("workspace %s failed: %v", id, got.Msg.Workspace.Failure)
			}
			time.Sleep(2 * time.Millisecond)
		}
		latencies = append(latencies, time.Since(start))
	}
	time.Sleep(2 * time.Second) // let idle guests settle
	after, err := memAvailable()
	if err != nil {
		return err
	}
	charged := cgroupCharge(ids)

	rootfs, err := baseRootfs(home)
	if err != nil {
		return err
	}
	bare, err := bareRunc(rootfs, n)
	if err != nil {
		return err
	}
	report("kibotos create→AVAILABLE", latencies)
	report("bare runc run /bin/true", bare)
	fmt.Printf("idle density: %.2f MiB charged to each idle workspace's memory cgroup; host MemAvailable fell %.2f MiB per workspace (%d workspaces, %d → %d MiB)\n",
		float64(charged)/float64(n)/(1<<20), float64(int64(before)-int64(after))/float64(n)/(1<<20), n, before>>20, after>>20)
	return nil
}

func report(name string, d []time.Duration) {
	slices.Sort(d)
	pct := func(p float64) time.Duration { return d[min(len(d)-1, int(float64(len(d))*p))] }
	fmt.Printf("%-28s n=%d p50=%v p99=%v\n", name, len(d), pct(0.50).Round(time.Millisecond), pct(0.99).Round(time.Millisecond))
}

// cgroupCharge sums the memory charged to the workspaces' cgroups (cgroup
// v1 memory controller, where the OCI driver puts them).
func cgroupCharge(ids []string) uint64 {
	var total uint64
	for _, id := range ids {
		files, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory/kibotos", id+"-*", "memory.usage_in_bytes"))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			total += v
		}
	}
	return total
}

func memAvailable() (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no MemAvailable")
}

// baseRootfs finds the unpacked layer of the built-in template (one
// layer, holding bin/busybox).
func baseRootfs(home string) (string, error) {
	dirs, _ := filepath.Glob(filepath.Join(home, "templates", "layers", "sha256", "*", "bin", "busybox"))
	if len(dirs) == 0 {
		return "", fmt.Errorf("no unpacked base layer under %s", home)
	}
	return filepath.Dir(filepath.Dir(dirs[0])), nil
}

// bareRunc times n one-shot `runc run` of /bin/true on rootfs (read-only).
func bareRunc(rootfs string, n int) ([]time.Duration, error) {
	dir, err := os.MkdirTemp("", "wsbench-runc")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if out, err := exec.Command("runc", "spec", "--bundle", dir).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("runc spec: %v %s", err, out)
	}
	path := filepath.Join(dir, "config.json")
	var spec map[string]any
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, err
	}
	spec["root"] = map[string]any{"path": rootfs, "readonly": true}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	if b, err = json.Marshal(spec); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return nil, err
	}
	var out []time.Duration
	for i := range n {
		start := time.Now()
		cmd := exec.Command("runc", "--root", filepath.Join(dir, "state"), "run", "--bundle", dir, fmt.Sprintf("wsbench-%d", i))
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("runc run: %v %s", err, b)
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}
