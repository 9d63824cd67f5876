// Command netbench measures a workspace's network slot beside the two
// common user-mode sandbox networks, pasta and slirp4netns, in one run on
// one machine: guest→host and host→guest TCP throughput, and the rate of
// guest-initiated TCP connections (connect, a 64-byte request and its
// response, close), one at a time. It needs root and the passt and
// slirp4netns packages; bench/netbench/run installs them when missing.
//
// The server runs in a test host's network namespace joined to the host by
// a veth pair (198.51.100.2), so every sandbox network reaches it the same
// way: from sockets in the host's namespace over the veth. The client is
// this program again, started inside the sandbox's network namespace,
// whose link has an MTU of 65520 in all three. The client's and the
// server's sockets use the congestion control -cc (cubic, whatever the
// machine's default), so runs on different machines compare. A fourth row,
// host, runs the client in the host's namespace: the path without a
// sandbox. Each figure is the median of -runs measurements of -d each, the
// networks taking turns.
//
//	go run ./bench/netbench -d 5s -runs 5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// mtu is every sandbox link's MTU, the slot's own.
const mtu = 65520

func main() {
	if len(os.Args) > 1 && os.Args[1] == clientCommand {
		if err := runClient(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "netbench client:", err)
			os.Exit(1)
		}
		return
	}
	d := flag.Duration("d", 5*time.Second, "duration of one measurement")
	runs := flag.Int("runs", 5, "measurements of each figure; the median is reported")
	networks := flag.String("networks", "kibotos,pasta,slirp4netns,host",
		"networks to measure: kibotos, pasta, slirp4netns, and host (no sandbox: the client in the host's namespace)")
	cc := flag.String("cc", "cubic", "TCP congestion control of the client's and the server's sockets (empty: the kernel's default)")
	serverCloses := flag.Bool("server-closes", false, "the server closes each connection of the connection rate first (as an HTTP/1.0 server does), not the guest")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (the slot and the server) to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "netbench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	connMode := modeConn
	if *serverCloses {
		connMode = modeConnServerCloses
	}
	if err := run(ctx, *d, *cc, *runs, strings.Split(*networks, ","), connMode); err != nil {
		fmt.Fprintln(os.Stderr, "netbench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// figures are one network's measurements of each kind.
type figures struct {
	up, down, conns []float64 // Gbit/s, Gbit/s, connections/s
}

func run(ctx context.Context, d time.Duration, cc string, runs int, names []string, connMode string) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, TUN, veth)")
	}
	if runs < 1 {
		return errors.New("-runs must be at least 1")
	}
	for _, name := range names {
		if name == "pasta" || name == "slirp4netns" {
			if _, err := exec.LookPath(name); err != nil {
				return fmt.Errorf("%s is not installed: apt-get install -y passt slirp4netns", name)
			}
		}
	}
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(os.Stderr, "load average before: %s", load)
	}
	dir, err := os.MkdirTemp("", "netbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	inet, stopInet, err := nettest.Start(dir)
	if err != nil {
		return fmt.Errorf("test host: %w", err)
	}
	defer stopInet()
	b := &bench{inet: inet, d: d, cc: cc}

	var sandboxes []*sandbox
	defer func() {
		for _, sb := range sandboxes {
			if err := sb.stop(); err != nil {
				fmt.Fprintf(os.Stderr, "netbench: stopping %s: %v\n", sb.name, err)
			}
		}
	}()
	for _, name := range names {
		sb, err := startSandbox(name, dir)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		sandboxes = append(sandboxes, sb)
		if sb.path == "" {
			continue
		}
		link, err := checkMTU(sb.path)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(os.Stderr, "%s: guest link %s, MTU %d\n", name, link, mtu)
	}

	results := map[string]*figures{}
	for i := range runs {
		for _, sb := range sandboxes {
			var r [3]result
			for j, mode := range []string{modeUp, modeDown, connMode} {
				if r[j], err = b.measure(ctx, sb, mode); err != nil {
					return fmt.Errorf("%s, %s: %w", sb.name, mode, err)
				}
			}
			f := results[sb.name]
			if f == nil {
				f = &figures{}
				results[sb.name] = f
			}
			f.up = append(f.up, r[0].gbits())
			f.down = append(f.down, r[1].gbits())
			f.conns = append(f.conns, r[2].rate())
			fmt.Fprintf(os.Stderr, "run %d/%d %-12s %6.2f Gbit/s up  %6.2f Gbit/s down  %7.0f conn/s\n",
				i+1, runs, sb.name, r[0].gbits(), r[1].gbits(), r[2].rate())
		}
	}
	report(names, results)
	return nil
}

// report prints the medians and the slot's ratios to the other sandbox
// networks.
func report(names []string, results map[string]*figures) {
	const row = "%-20s %17s %17s %8s\n"
	fmt.Printf(row, "network", "guest→host Gbit/s", "host→guest Gbit/s", "conn/s")
	for _, name := range names {
		f := results[name]
		label := name
		if name == "host" {
			label = "host (no sandbox)"
		}
		fmt.Printf(row, label, fmt.Sprintf("%.2f", median(f.up)), fmt.Sprintf("%.2f", median(f.down)), fmt.Sprintf("%.0f", median(f.conns)))
	}
	k := results["kibotos"]
	for _, name := range names {
		if f := results[name]; k != nil && name != "kibotos" && name != "host" {
			fmt.Printf(row, "kibotos/"+name, fmt.Sprintf("%.2f", median(k.up)/median(f.up)),
				fmt.Sprintf("%.2f", median(k.down)/median(f.down)), fmt.Sprintf("%.2f", median(k.conns)/median(f.conns)))
		}
	}
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
