// Command exposebench measures an exposure of a running `kibotos up`: it
// starts a web server in a workspace, exposes its port, and times a
// download of -mib MiB of zeros through the exposure, beside the same
// server binary serving the same download on the host's loopback in the
// same run. It reports MiB/s of each, best of -runs.
//
//	go run ./bench/exposebench -addr 127.0.0.1:8870 -home /var/lib/kibotos
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk"
)

const webappPackage = "github.com/kibotos/kibotos/internal/testutil/webapp"

func main() {
	addr, home := benchutil.DeploymentFlags()
	mib := flag.Int64("mib", 1024, "size of each download, in MiB")
	runs := flag.Int("runs", 3, "downloads of each kind; the best counts")
	benchutil.Main("exposebench", func() error { return run(*addr, *home, *mib<<20, *runs) })
}

func run(addr, home string, size int64, runs int) error {
	token, err := benchutil.AdminToken(home)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "exposebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "webapp")
	if err := testutil.Build(bin, webappPackage); err != nil {
		return err
	}

	// The loopback baseline: the same server on the host.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	localAddr := ln.Addr().String()
	ln.Close()
	local := exec.Command(bin, "-addr", localAddr, "-log", filepath.Join(dir, "requests"))
	if err := local.Start(); err != nil {
		return err
	}
	defer func() { local.Process.Kill(); local.Wait() }()

	client := sdk.New("http://"+addr, token)
	defer client.Close()
	ctx := context.Background()
	ws, err := client.CreateWorkspace(ctx, sdk.CreateOptions{MemoryBytes: 512 << 20, DiskBytes: 256 << 20})
	if err != nil {
		return err
	}
	defer client.DeleteWorkspace(ctx, ws.ID())
	f, err := os.Open(bin)
	if err != nil {
		return err
	}
	_, err = ws.Upload(ctx, f, "/root/webapp", 0o755)
	f.Close()
	if err != nil {
		return err
	}
	if _, err := ws.Start(ctx, []string{"/root/webapp", "-addr", ":8080"}, sdk.ExecOptions{}); err != nil {
		return err
	}
	x, err := ws.Expose(ctx, 8080, sdk.ExposeOptions{})
	if err != nil {
		return err
	}
	header := http.Header{"Authorization": {"Bearer " + x.Token}}
	query := fmt.Sprintf("zeros?n=%d", size)
	// Wait for the server and the route.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := download(x.URL+"zeros?n=1", header, 1); err == nil {
			break
		} else if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range []struct {
		name, url string
		header    http.Header
	}{
		{"loopback (host)", "http://" + localAddr + "/" + query, nil},
		{"exposure", x.URL + query, header},
	} {
		best := 0.0
		for range runs {
			d, err := download(c.url, c.header, size)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			best = max(best, float64(size)/(1<<20)/d.Seconds())
		}
		fmt.Printf("%-16s %d MiB: %.0f MiB/s (best of %d)\n", c.name, size>>20, best, runs)
	}
	return nil
}

// download GETs url and times reading its body, which must be size bytes.
func download(url string, header http.Header, size int64) (time.Duration, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	if header != nil {
		req.Header = header
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil && (resp.StatusCode != http.StatusOK || n != size) {
		err = fmt.Errorf("%s: %d bytes", resp.Status, n)
	}
	return time.Since(start), err
}
