// Command netbench measures a workspace's network slot beside the two
// common user-mode sandbox networks, pasta and slirp4netns, in one run on
// one machine: guest→host and host→guest TCP throughput on one connection
// and on 8 parallel ones, and the rate of guest-initiated TCP connections
// (connect, a 64-byte request and its response, close), one at a time. It
// also measures the slot reaching the server through a SOCKS5 Egress
// (network socks5) beside its direct path, and DNS queries to the slot's
// link address beside the same resolver queried from the host. It needs root and the passt and
// slirp4netns packages; bench/netbench/run installs them when missing.
//
// The server runs in a test host's network namespace joined to the host by
// a veth pair (198.51.100.2), so every sandbox network reaches it the same
// way: from sockets in the host's namespace over the veth. It is this
// program again in a process of its own, so that the slot, in this
// process, shares its Go runtime with no server, as pasta and slirp4netns
// share theirs with none. The client is this program again too, started
// inside the sandbox's network namespace,
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
	if len(os.Args) > 1 && (os.Args[1] == clientCommand || os.Args[1] == serverCommand) {
		run := runClient
		if os.Args[1] == serverCommand {
			run = runServer
		}
		if err := run(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "netbench %s: %v\n", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
	d := flag.Duration("d", 5*time.Second, "duration of one measurement")
	runs := flag.Int("runs", 5, "measurements of each figure; the median is reported")
	networks := flag.String("networks", "kibotos,socks5,pasta,slirp4netns,host,host-socks5",
		"networks to measure: kibotos, socks5 (the slot reaching the test host through a SOCKS5 Egress), pasta, slirp4netns, host (no sandbox: the client in the host's namespace) and host-socks5 (the same client through the SOCKS5 server)")
	cc := flag.String("cc", "cubic", "TCP congestion control of the client's and the server's sockets (empty: the kernel's default)")
	serverCloses := flag.Bool("server-closes", false, "the server closes each connection of the connection rate first (as an HTTP/1.0 server does), not the guest")
	only := flag.String("only", "", "measure only these workloads (comma-separated: up, down, up8, down8, conn, dns); empty: all")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (the slots) to this file")
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
	var filter []string
	if *only != "" {
		filter = strings.Split(*only, ",")
	}
	if err := run(ctx, *d, *cc, *runs, strings.Split(*networks, ","), connMode, filter); err != nil {
		fmt.Fprintln(os.Stderr, "netbench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// The workloads of each sandbox network.
var (
	up1, down1 = workload{mode: modeUp, streams: 1}, workload{mode: modeDown, streams: 1}
	up8, down8 = workload{mode: modeUp, streams: 8}, workload{mode: modeDown, streams: 8}
	dnsQueries = workload{mode: modeDNS}
)

// workloads are what is measured in the network name: the Egress row
// (socks5) carries single streams and connections; the DNS row compares
// the slot's link address with the test host's resolver queried from the
// host, so only those two answer queries.
func workloads(name string, conn workload) []workload {
	switch name {
	case "socks5", "host-socks5":
		return []workload{up1, down1, conn}
	case "kibotos", "host":
		return []workload{up1, down1, up8, down8, conn, dnsQueries}
	}
	return []workload{up1, down1, up8, down8, conn}
}

// column is one figure of the report.
type column struct {
	title string
	w     workload
	value func(result) float64
	unit  string
}

func columns(conn workload) []column {
	gbits := func(r result) float64 { return r.gbits() }
	rate := func(r result) float64 { return r.rate() }
	return []column{
		{"guest→host", up1, gbits, "Gbit/s"}, {"host→guest", down1, gbits, "Gbit/s"},
		{"guest→host×8", up8, gbits, "Gbit/s"}, {"host→guest×8", down8, gbits, "Gbit/s"},
		{"conn/s", conn, rate, ""}, {"DNS", dnsQueries, rate, "q/s"},
	}
}

func run(ctx context.Context, d time.Duration, cc string, runs int, names []string, connMode string, only []string) error {
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
	dns, stopDNS, err := b.startServer(ctx, kindDNS)
	if err != nil {
		return err
	}
	defer stopDNS()
	b.dns = dns

	var sandboxes []*sandbox
	defer func() {
		for _, sb := range sandboxes {
			if err := sb.stop(); err != nil {
				fmt.Fprintf(os.Stderr, "netbench: stopping %s: %v\n", sb.name, err)
			}
		}
	}()
	for _, name := range names {
		sb, err := startSandbox(name, dir, dns)
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

	cols := columns(workload{mode: connMode})
	results := map[string]map[workload][]float64{}
	for i := range runs {
		for _, sb := range sandboxes {
			if results[sb.name] == nil {
				results[sb.name] = map[workload][]float64{}
			}
			line := fmt.Sprintf("run %d/%d %-12s", i+1, runs, sb.name)
			for _, w := range workloads(sb.name, workload{mode: connMode}) {
				if only != nil && !slices.Contains(only, w.String()) {
					continue
				}
				var cpu time.Duration
				if sb.cpu != nil {
					cpu = sb.cpu()
				}
				r, err := b.measure(ctx, sb, w)
				if err != nil {
					return fmt.Errorf("%s, %s: %w", sb.name, w, err)
				}
				for _, c := range cols {
					if c.w == w {
						results[sb.name][w] = append(results[sb.name][w], c.value(r))
						line += fmt.Sprintf("  %s %.2f %s", c.title, c.value(r), c.unit)
					}
				}
				// The network's own CPU: the slot's (this process), pasta's
				// or slirp4netns'; the host's kernel is not counted.
				if sb.cpu != nil {
					cpu = sb.cpu() - cpu
					if r.Bytes > 0 {
						line += fmt.Sprintf(" (%.2f cpu s/GB)", cpu.Seconds()/(float64(r.Bytes)/1e9))
					} else if r.Conns > 0 {
						line += fmt.Sprintf(" (%.0f cpu µs each)", float64(cpu.Microseconds())/float64(r.Conns))
					}
				}
				if r.Lost > 0 {
					line += fmt.Sprintf(" (%d lost)", r.Lost)
				}
				if r.Connecting > 0 {
					line += fmt.Sprintf(" (connect %d µs, request and response %d µs)",
						(r.Connecting / time.Duration(r.Conns)).Microseconds(), (r.Exchanging / time.Duration(r.Conns)).Microseconds())
				}
			}
			fmt.Fprintln(os.Stderr, line)
		}
	}
	report(names, cols, results)
	return nil
}

// ownCPU is the CPU time this process has used.
func ownCPU() time.Duration {
	var u syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// report prints the medians and the ratios the targets are stated in: the
// slot to each other sandbox network, the Egress to the slot's direct
// path, and the slot's link DNS address to the resolver queried from the
// host.
func report(names []string, cols []column, results map[string]map[workload][]float64) {
	fmt.Printf("%-22s", "network")
	for _, c := range cols {
		fmt.Printf(" %17s", c.title+" "+strings.TrimPrefix(c.unit, "/"))
	}
	fmt.Println()
	row := func(label string, value func(c column) (float64, bool), format string) {
		fmt.Printf("%-22s", label)
		for _, c := range cols {
			if v, ok := value(c); ok {
				fmt.Printf(" %17s", fmt.Sprintf(format, v))
			} else {
				fmt.Printf(" %17s", "-")
			}
		}
		fmt.Println()
	}
	med := func(name string, c column) (float64, bool) {
		v := results[name][c.w]
		if len(v) == 0 {
			return 0, false
		}
		return median(v), true
	}
	for _, name := range names {
		label := name
		switch name {
		case "host":
			label = "host (no sandbox)"
		case "socks5":
			label = "kibotos via SOCKS5"
		case "host-socks5":
			label = "host via SOCKS5"
		}
		row(label, func(c column) (float64, bool) { return med(name, c) }, "%.2f")
	}
	ratio := func(a, b string, only func(c column) bool) func(c column) (float64, bool) {
		return func(c column) (float64, bool) {
			x, ok1 := med(a, c)
			y, ok2 := med(b, c)
			return x / y, ok1 && ok2 && y > 0 && (only == nil || only(c))
		}
	}
	for _, name := range names {
		if name == "pasta" || name == "slirp4netns" {
			row("kibotos/"+name, ratio("kibotos", name, nil), "%.2f")
		}
	}
	if slices.Contains(names, "socks5") {
		row("SOCKS5/direct", ratio("socks5", "kibotos", nil), "%.2f")
	}
	if slices.Contains(names, "host-socks5") && slices.Contains(names, "host") {
		// The proxy hop's own cost, the floor under the row above.
		row("SOCKS5/direct, host", ratio("host-socks5", "host", func(c column) bool { return c.w != dnsQueries }), "%.2f")
	}
	if slices.Contains(names, "host") {
		row("link DNS/from host", ratio("kibotos", "host", func(c column) bool { return c.w == dnsQueries }), "%.2f")
	}
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
