// Command ctrlbench measures the control plane under load: reads and
// mutating commands from many parallel callers, and the fan-out of one
// change to many WatchWorkspace streams. It runs the real control plane
// in-process (the handlers of internal/ctrl/server behind the auth
// interceptor, served over HTTP on loopback) on a fresh SQLite store in a
// temporary directory, and on PostgreSQL when -postgres names a database.
//
//	go run ./bench/ctrlbench [-postgres postgres://...] [-duration 3s]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/ctrl/store"
	"github.com/kibotos/kibotos/internal/ctrl/store/postgres"
	"github.com/kibotos/kibotos/internal/ctrl/store/sqlite"
	"github.com/kibotos/kibotos/internal/ctrl/templates"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/netcheck"
	"github.com/kibotos/kibotos/sdk/bearer"
)

const hostToken = "ctrlbench-host-token"

var (
	pgURL    = flag.String("postgres", "", "PostgreSQL URL of an empty database to measure too")
	duration = flag.Duration("duration", 3*time.Second, "how long each throughput row runs")
	warmup   = flag.Duration("warmup", 500*time.Millisecond, "how long each throughput row runs unmeasured first")
	callers  = flag.Int("callers", 64, "parallel callers of the throughput rows")
	watchers = flag.Int("watchers", 1000, "WatchWorkspace streams of the fan-out row")
	busybox  = flag.String("busybox", "/bin/busybox", "static busybox for the built-in template")
	profile  = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memprof  = flag.String("memprofile", "", "write an allocation profile of the whole run to this file")
	rows     = flag.String("rows", "", "run only the rows whose name matches this regular expression")
)

func main() {
	flag.Parse()
	// Calls cut off when a run ends are logged by the handlers; they are
	// not what is measured.
	slog.SetDefault(slog.New(slog.DiscardHandler))
	// SetDefault sent the log package's output to that handler too: the
	// benchmark's own fatal errors go to stderr.
	log.SetOutput(os.Stderr)
	if *profile != "" {
		f, err := os.Create(*profile)
		must(err)
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	if *memprof != "" {
		defer func() {
			f, err := os.Create(*memprof)
			must(err)
			must(pprof.Lookup("allocs").WriteTo(f, 0))
			must(f.Close())
		}()
	}
	dir, err := os.MkdirTemp("", "ctrlbench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "kibotos.db"))
	if err != nil {
		log.Fatal(err)
	}
	run("sqlite", st, dir, true)
	if *pgURL != "" {
		st, err := postgres.Open(ctx, *pgURL)
		if err != nil {
			log.Fatal(err)
		}
		run("postgres", st, dir, false)
	}
}

// bench is one control plane under measurement.
type bench struct {
	ctx        context.Context
	workspaces ctrlv1connect.WorkspaceServiceClient
	egress     ctrlv1connect.EgressServiceClient
	client     *http.Client
	url, token string
}

func run(backend string, st store.Store, dir string, watch bool) {
	defer st.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	admin, err := auth.Bootstrap(ctx, st, time.Now(), nil)
	must(err)
	if admin == "" {
		log.Fatalf("%s: the store is not empty (it has an operator project, whose token this benchmark cannot know): give it an empty database", backend)
	}
	images, err := imagestore.Open(filepath.Join(dir, backend+"-images"))
	must(err)
	must(templates.EnsureBuiltin(ctx, st, images, *busybox))
	h, err := server.Handler(ctx, server.Config{Store: st, Checker: &netcheck.Checker{}, Images: images, HostToken: hostToken})
	must(err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	served := make(chan error, 1)
	go func() { served <- server.Serve(ctx, ln, h, time.Second) }()
	defer func() { cancel(); <-served }()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *watchers + *callers + 16}}
	b := &bench{ctx: ctx, client: client, url: "http://" + ln.Addr().String(), token: admin}
	opt := connect.WithInterceptors(bearer.Token(admin))
	b.workspaces = ctrlv1connect.NewWorkspaceServiceClient(client, b.url, opt)
	b.egress = ctrlv1connect.NewEgressServiceClient(client, b.url, opt)
	hosts := hostv1connect.NewHostServiceClient(client, b.url, connect.WithInterceptors(bearer.Token(hostToken)))
	_, err = hosts.RegisterHost(ctx, connect.NewRequest(&hostv1.RegisterHostRequest{HostId: "bench", Capacity: &hostv1.HostCapacity{
		CpuMillis: 1 << 30, MemoryBytes: 1 << 50, LayerBytes: 1 << 50, DefaultLayerBytes: 1 << 30}}))
	must(err)

	// One workspace per caller, so that label updates do not contend on
	// one revision.
	ws := make([]*ctrlv1.Workspace, *callers)
	for i := range ws {
		ws[i] = b.createWorkspace()
	}
	eg, err := b.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: command(), Spec: socks5()}))
	must(err)
	egressID := eg.Msg.Egress.EgressId

	ceiling := b.throughput(backend, "no-op GetEgress", b.noop(ctx, eg.Msg.Egress))
	b.readRow(backend, "GetWorkspace", ceiling, func(i int) error {
		_, err := b.workspaces.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: ws[i].WorkspaceId}))
		return err
	})
	b.readRow(backend, "GetEgress", ceiling, func(int) error {
		_, err := b.egress.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: egressID}))
		return err
	})
	b.throughput(backend, "CreateEgress", func(int) error {
		_, err := b.egress.CreateEgress(ctx, connect.NewRequest(&ctrlv1.CreateEgressRequest{Command: command(), Spec: socks5()}))
		return err
	})
	revisions := make([]uint64, len(ws))
	for i, w := range ws {
		revisions[i] = w.LabelsRevision
	}
	b.throughput(backend, "UpdateWorkspaceLabels", func(i int) error {
		resp, err := b.workspaces.UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{
			Command: command(), WorkspaceId: ws[i].WorkspaceId, ExpectedLabelsRevision: revisions[i],
			Labels: map[string]string{"n": strconv.FormatUint(revisions[i], 10)}}))
		if err == nil {
			revisions[i] = resp.Msg.Workspace.LabelsRevision
		}
		return err
	})
	if watch {
		b.fanOut(backend, ws[0])
	}
}

// noopEgress answers GetEgress with one Egress and does nothing else: no
// interceptor, no authentication, no store.
type noopEgress struct {
	ctrlv1connect.UnimplementedEgressServiceHandler
	egress *ctrlv1.Egress
}

func (h noopEgress) GetEgress(context.Context, *connect.Request[ctrlv1.GetEgressRequest]) (*connect.Response[ctrlv1.GetEgressResponse], error) {
	return connect.NewResponse(&ctrlv1.GetEgressResponse{Egress: h.egress}), nil
}

// noop serves a noopEgress answering eg the way the control plane is
// served (server.Serve and its HandlerOptions, the same client) and
// returns a caller of it: the
// most calls a second this transport carries on this machine, the ceiling
// of the read rows.
func (b *bench) noop(ctx context.Context, eg *ctrlv1.Egress) func(int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	mux := http.NewServeMux()
	mux.Handle(ctrlv1connect.NewEgressServiceHandler(noopEgress{egress: eg}, server.HandlerOptions()...))
	go server.Serve(ctx, ln, mux, time.Second)
	client := ctrlv1connect.NewEgressServiceClient(b.client, "http://"+ln.Addr().String(), connect.WithInterceptors(bearer.Token(b.token)))
	return func(int) error {
		_, err := client.GetEgress(ctx, connect.NewRequest(&ctrlv1.GetEgressRequest{EgressId: eg.EgressId}))
		return err
	}
}

// readRow is a throughput row that also prints its rate as a share of
// ceiling, the no-op call's (when that row ran).
func (b *bench) readRow(backend, name string, ceiling float64, call func(i int) error) {
	if rate := b.throughput(backend, name, call); rate > 0 && ceiling > 0 {
		fmt.Printf("%-9s %-22s %.2f of the no-op call's rate\n", backend, name, rate/ceiling)
	}
}

// throughput runs call from *callers goroutines (caller i passes i) for
// *warmup, so that every caller has its connections (HTTP and store) open,
// then for *duration, and prints and returns the rate of successful calls
// of the latter (0 when the row is not selected).
func (b *bench) throughput(backend, name string, call func(i int) error) float64 {
	if !selected(name) {
		return 0
	}
	calls(backend, name, *warmup, call)
	start, cpu := time.Now(), cpuTime()
	n := calls(backend, name, *duration, call)
	elapsed, used := time.Since(start), cpuTime()-cpu
	rate := float64(n) / elapsed.Seconds()
	fmt.Printf("%-9s %-22s %3d callers  %8.0f /s  %5.0f µs CPU/call  (%d calls in %v)\n", backend, name, *callers,
		rate, float64(used.Microseconds())/float64(n), n, elapsed.Round(time.Millisecond))
	return rate
}

// calls runs call from *callers goroutines for d and returns how many
// succeeded; a failure ends the benchmark.
func calls(backend, name string, d time.Duration, call func(i int) error) int64 {
	var (
		n    atomic.Int64
		wg   sync.WaitGroup
		fail atomic.Pointer[error]
	)
	deadline := time.Now().Add(d)
	for i := range *callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := call(i); err != nil {
					fail.CompareAndSwap(nil, &err)
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := fail.Load(); err != nil {
		log.Fatalf("%s %s: %v", backend, name, *err)
	}
	return n.Load()
}

// fanOut opens *watchers WatchWorkspace streams on w, changes its labels
// once, and reports how long each watcher took to see the change.
func (b *bench) fanOut(backend string, w *ctrlv1.Workspace) {
	if !selected("WatchWorkspace") {
		return
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	current, err := b.workspaces.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: w.WorkspaceId}))
	must(err)
	revision := current.Msg.Workspace.LabelsRevision
	var (
		ready   sync.WaitGroup
		seen    sync.WaitGroup
		mu      sync.Mutex
		arrived []time.Time
	)
	ready.Add(*watchers)
	seen.Add(*watchers)
	for range *watchers {
		go func() {
			defer seen.Done()
			stream, err := b.workspaces.WatchWorkspace(ctx, connect.NewRequest(&ctrlv1.WatchWorkspaceRequest{WorkspaceId: w.WorkspaceId}))
			must(err)
			first := true
			for stream.Receive() {
				if first {
					ready.Done()
					first = false
				}
				if stream.Msg().Workspace.LabelsRevision > revision {
					mu.Lock()
					arrived = append(arrived, time.Now())
					mu.Unlock()
					return
				}
			}
			if err := stream.Err(); err != nil && !errors.Is(err, context.Canceled) {
				log.Fatalf("watch: %v", err)
			}
		}()
	}
	ready.Wait()
	start := time.Now()
	_, err = b.workspaces.UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{
		Command: command(), WorkspaceId: w.WorkspaceId, ExpectedLabelsRevision: revision, Labels: map[string]string{"fan": "out"}}))
	must(err)
	answered := time.Since(start)
	done := make(chan struct{})
	go func() { seen.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	mu.Lock()
	lat := make([]time.Duration, len(arrived))
	for i, t := range arrived {
		lat[i] = t.Sub(start)
	}
	mu.Unlock()
	slices.Sort(lat)
	if len(lat) == 0 {
		log.Fatalf("%s WatchWorkspace: no watcher saw the change", backend)
	}
	pct := func(p float64) time.Duration {
		return lat[min(len(lat)-1, int(float64(len(lat))*p))].Round(100 * time.Microsecond)
	}
	fmt.Printf("%-9s %-22s %d watchers, one change: %d saw it; p50 %v p99 %v max %v (command answered in %v)\n",
		backend, "WatchWorkspace", *watchers, len(lat), pct(0.5), pct(0.99), lat[len(lat)-1].Round(100*time.Microsecond),
		answered.Round(100*time.Microsecond))
}

func (b *bench) createWorkspace() *ctrlv1.Workspace {
	resp, err := b.workspaces.CreateWorkspace(b.ctx, connect.NewRequest(&ctrlv1.CreateWorkspaceRequest{Command: command(),
		Spec: &ctrlv1.WorkspaceCreateSpec{Resources: &ctrlv1.ResourceRequest{CpuMillis: 100, MemoryBytes: 128 << 20, WritableLayerBytes: 64 << 20}}}))
	must(err)
	return resp.Msg.Workspace
}

func selected(row string) bool {
	ok, err := regexp.MatchString(*rows, row)
	must(err)
	return ok
}

// cpuTime is the CPU time this process (server and callers alike) has
// used: unlike the rate, it does not depend on what else the machine runs.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	must(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func command() *ctrlv1.CommandMetadata { return &ctrlv1.CommandMetadata{CommandId: uuid.NewString()} }

// socks5 is an Egress spec that needs no name resolution.
func socks5() *ctrlv1.EgressSpec {
	return &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "93.184.216.34:1080"}}}
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
