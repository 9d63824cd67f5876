// Command pfbench measures a download from a web server inside a
// workspace of a running `kibotos up`, through `kibotos ws port-forward`
// and through the SDK's DialPort, beside the same download over a plain
// loopback TCP connection, all in one run. Every download is checked
// whole (its length and CRC-32C).
//
//	go run ./bench/pfbench -addr 127.0.0.1:8870 -home /var/lib/kibotos -mib 1024
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos/bench/internal/benchutil"
	"github.com/kibotos/kibotos/internal/cli"
	"github.com/kibotos/kibotos/sdk"
)

// block is the unit the payload repeats: random bytes, so that nothing on
// the way can compress them.
const block = 64 << 20

func main() {
	addr, home := benchutil.DeploymentFlags()
	mib := flag.Int("mib", 1024, "size of the download, in MiB (a multiple of 64)")
	runs := flag.Int("runs", 3, "downloads of each kind; the best is reported")
	benchutil.Main("pfbench", func() error { return run(*addr, *home, *mib, *runs) })
}

// payload is a download of n bytes: block random bytes again and again.
type payload struct {
	unit []byte
	n    int64
	crc  uint32
}

func newPayload(n int64) *payload {
	p := &payload{unit: make([]byte, block), n: n}
	mathrand.NewChaCha8([32]byte{9}).Read(p.unit)
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	io.Copy(h, p.reader())
	p.crc = h.Sum32()
	return p
}

func (p *payload) reader() io.Reader {
	return io.LimitReader(&repeat{unit: p.unit}, p.n)
}

// check reads r to its end and fails unless it is the payload.
func (p *payload) check(r io.Reader) error {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	n, err := io.CopyBuffer(h, r, make([]byte, 256<<10))
	if err != nil {
		return err
	}
	if n != p.n || h.Sum32() != p.crc {
		return fmt.Errorf("got %d bytes with CRC-32C %08x, want %d with %08x", n, h.Sum32(), p.n, p.crc)
	}
	return nil
}

type repeat struct {
	unit []byte
	off  int
}

func (r *repeat) Read(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		c := copy(b[n:], r.unit[r.off:])
		n += c
		r.off = (r.off + c) % len(r.unit)
	}
	return n, nil
}

func run(addr, home string, mib, runs int) error {
	if mib <= 0 || mib%(block>>20) != 0 {
		return fmt.Errorf("-mib %d: want a positive multiple of %d", mib, block>>20)
	}
	token, err := benchutil.AdminToken(home)
	if err != nil {
		return err
	}
	ctx := context.Background()
	p := newPayload(int64(mib) << 20)
	client := sdk.New("http://"+addr, token)
	defer client.Close()
	ws, err := client.CreateWorkspace(ctx, sdk.CreateOptions{MemoryBytes: 512 << 20, DiskBytes: uint64(mib+256) << 20})
	if err != nil {
		return err
	}
	defer client.DeleteWorkspace(context.WithoutCancel(ctx), ws.ID())
	if err := ws.MkdirAll(ctx, "/root/www", 0o755); err != nil {
		return err
	}
	if _, err := ws.Upload(ctx, p.reader(), "/root/www/blob", 0o644); err != nil {
		return err
	}
	if _, err := ws.Start(ctx, []string{"httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/root/www"}, sdk.ExecOptions{}); err != nil {
		return err
	}

	local, stop, err := portForward(addr, token, ws.ID(), "0:8000")
	if err != nil {
		return err
	}
	defer stop()
	loopback, err := serveLoopback(p)
	if err != nil {
		return err
	}
	defer loopback.Close()

	viaForward := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	viaDialPort := &http.Client{Transport: &http.Transport{DisableCompression: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return ws.DialPort(ctx, 8000) }}}
	kinds := []struct {
		name   string
		client *http.Client
		url    string
	}{
		{"plain loopback TCP", http.DefaultClient, "http://" + loopback.Addr().String() + "/blob"},
		{"ws port-forward", viaForward, "http://" + local + "/blob"},
		{"sdk DialPort", viaDialPort, "http://workspace/blob"},
	}
	// Wait for httpd.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c, err := ws.DialPort(ctx, 8000)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("httpd does not listen: %w", err)
		}
	}
	for _, k := range kinds {
		var best time.Duration
		for range runs {
			d, err := download(k.client, k.url, p)
			if err != nil {
				return fmt.Errorf("%s: %w", k.name, err)
			}
			if best == 0 || d < best {
				best = d
			}
		}
		fmt.Printf("%-20s %d MiB: best of %d %.0f MiB/s (checked whole)\n", k.name, mib, runs, float64(mib)/best.Seconds())
	}
	return nil
}

// download fetches url, checks it is the payload and returns how long it
// took.
func download(c *http.Client, url string, p *payload) (time.Duration, error) {
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, errors.New(resp.Status)
	}
	if err := p.check(resp.Body); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// serveLoopback serves the payload at /blob on a loopback port.
func serveLoopback(p *payload) (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(p.n))
		io.CopyBuffer(w, p.reader(), make([]byte, 256<<10))
	}))
	return ln, nil
}

var forwarding = regexp.MustCompile(`^Forwarding from (\S+) -> \d+$`)

// portForward runs `kibotos ws port-forward` in this process and returns
// the local address it listens on.
func portForward(addr, token, id, pair string) (string, func(), error) {
	root := &cobra.Command{Use: "kibotos", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(cli.Commands()...)
	out, w := io.Pipe()
	root.SetOut(w)
	root.SetErr(os.Stderr)
	root.SetArgs([]string{"ws", "port-forward", "--addr", addr, "--token", token, id, pair})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		err := root.ExecuteContext(ctx)
		w.CloseWithError(cmp.Or(err, io.EOF))
		done <- err
	}()
	stop := func() {
		cancel()
		<-done
	}
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		cancel()
		return "", nil, fmt.Errorf("port-forward: %v", <-done)
	}
	m := forwarding.FindStringSubmatch(strings.TrimSpace(lines.Text()))
	if m == nil {
		stop()
		return "", nil, fmt.Errorf("port-forward printed %q", lines.Text())
	}
	go io.Copy(io.Discard, out)
	return m[1], stop, nil
}
