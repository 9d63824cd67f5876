package daemon

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/gen/kibotos/host/v1/hostv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/server"
	"github.com/kibotos/kibotos/internal/ctrl/volumes"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/agent"
	"github.com/kibotos/kibotos/internal/host/runtime/oci"
	"github.com/kibotos/kibotos/internal/imagestore"
)

// Overcommit is how many times its cores and its memory a host offers to
// placement. Each workspace's own limits still hold (its CPU quota, its
// memory.max); what is overcommitted is their sum. CPU is compressible:
// idle workspaces use none, so like shared-CPU machines elsewhere the sum
// of quotas may exceed the cores. Memory is not: past 1, workspaces that
// all use their memory at once push the host into reclaim and its OOM
// killer, so it is for many idle workspaces (density), at the operator's
// choice. Disk is never overcommitted.
type Overcommit struct {
	CPU, Memory float64
}

// DefaultOvercommit offers four times the cores and exactly the memory.
var DefaultOvercommit = Overcommit{CPU: 4, Memory: 1}

// MaxOvercommit bounds either factor: past it a host's figures no longer
// mean anything.
const MaxOvercommit = 64

// Check refuses factors below 1 (a host offers at least what it has) or
// above MaxOvercommit.
func (o Overcommit) Check() error {
	for _, f := range []struct {
		name   string
		factor float64
	}{{"cpu", o.CPU}, {"memory", o.Memory}} {
		if !(f.factor >= 1 && f.factor <= MaxOvercommit) {
			return fmt.Errorf("%s overcommit %g: want 1 to %d", f.name, f.factor, MaxOvercommit)
		}
	}
	return nil
}

func (o Overcommit) orDefault() Overcommit {
	return Overcommit{CPU: cmp.Or(o.CPU, DefaultOvercommit.CPU), Memory: cmp.Or(o.Memory, DefaultOvercommit.Memory)}
}

// DefaultLayerBytes is the writable layer a workspace gets when it asks
// for none: the host storage profile's default.
const DefaultLayerBytes = 1 << 30

// localHostID names the host agent of `kibotos up`.
const localHostID = "local"

// hostLockFile is the file under a host's home whose lock its agent holds.
const hostLockFile = "host.lock"

// lockHostHome takes the lock of the host home dir, held until the
// returned file is closed: two agents on one home would each take the
// other's executions for leftovers and end them.
func lockHostHome(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, hostLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("another host agent serves the home %s: one agent at a time may", dir)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return f, nil
}

// newHostAgent builds the in-process host agent, which reaches ctrl through
// the host API on ctrlURL exactly as a separate `kibotos host` would, and
// serves its data plane and exposures at publicURL.
func newHostAgent(o Options, images *imagestore.Store, hc *http.Client, ctrlURL, publicURL, exposureURL string, token connect.Interceptor, metrics prometheus.Registerer) (*agent.Agent, error) {
	driver, err := oci.New(oci.Config{StateDir: filepath.Join(o.stateDir(), "runtime"), Runtime: o.Runtime,
		GuestTmpfsPercent: o.GuestTmpfsPercent})
	if err != nil {
		return nil, err
	}
	guest, err := o.guestAgent()
	if err != nil {
		return nil, err
	}
	launch, err := hostLaunch(context.Background(), driver, guest)
	if err != nil {
		return nil, err
	}
	var capabilities []string
	if err := driver.ProbeGvisor(context.Background()); err == nil {
		capabilities = append(capabilities, guestabi.CapabilityGvisor)
	} else if o.Runtime == oci.Runsc {
		slog.Warn("runsc does not run sandboxes here: this host does not offer runtime.gvisor", "err", err)
	}
	over := o.Overcommit.orDefault()
	if err := over.Check(); err != nil {
		return nil, err
	}
	pools, err := storagePools(o)
	if err != nil {
		return nil, err
	}
	capacity, err := hostCapacity(filepath.Join(o.stateDir(), "layers"), pools, over)
	if err != nil {
		return nil, err
	}
	resolvers := o.DeploymentResolvers
	if resolvers == nil {
		resolvers = systemResolvers()
	}
	images.SetMaxLayerBytes(o.MaxLayerBytes)
	client := hostv1connect.NewHostServiceClient(hc, ctrlURL, connect.WithInterceptors(token))
	return agent.New(agent.Config{
		HostID: cmp.Or(o.HostID, localHostID), Client: client, Driver: driver, Layers: driver, Template: images,
		LayerDir: filepath.Join(o.stateDir(), "layers"), GuestAgent: guest, Capacity: capacity,
		Launches: []*hostv1.Launch{launch}, Capabilities: capabilities,
		Runtimes: oci.Detect(), DataPlaneEndpoint: publicURL, ExposureDomain: o.ExposureDomain, ExposureEndpoint: exposureURL,
		Network: agent.NetworkConfig{Dir: filepath.Join(o.stateDir(), "netns"),
			DeploymentResolvers: resolvers, UnsafeExemptRanges: o.UnsafeExemptRanges, MaxConnections: o.GuestConnections},
		StoragePools: pools, GuestProbeInterval: o.GuestProbeInterval, GuestMemory: o.GuestMemory, Metrics: metrics,
		WarmPool: o.WarmPool, CallsPerProject: connectionLimit() / callerShare,
	})
}

// DefaultVolumeBytes is the capacity of a Volume created without one: the
// storage profile's default.
const DefaultVolumeBytes = 1 << 30

// storagePools parses Options.StoragePools (NAME=DIR each).
func storagePools(o Options) ([]agent.StoragePool, error) {
	size := o.VolumeBytes
	if size == 0 {
		size = DefaultVolumeBytes
	}
	if size%(1<<20) != 0 {
		return nil, fmt.Errorf("volume size %d is not a whole number of MiB", size)
	}
	specs := o.StoragePools
	if len(specs) == 0 {
		specs = []string{server.DefaultStoragePool + "=" + filepath.Join(o.stateDir(), "volumes")}
	}
	var pools []agent.StoragePool
	seen := map[string]bool{}
	for _, spec := range specs {
		name, dir, ok := strings.Cut(spec, "=")
		if !ok || !filepath.IsAbs(dir) {
			return nil, fmt.Errorf("storage pool %q: want NAME=DIR with an absolute DIR", spec)
		}
		if err := volumes.ValidPoolName(name); err != nil {
			return nil, err
		}
		if seen[name] {
			return nil, fmt.Errorf("storage pool %q is named twice", name)
		}
		seen[name] = true
		pools = append(pools, agent.StoragePool{Name: name, Dir: filepath.Clean(dir), DefaultVolumeBytes: size})
	}
	return pools, nil
}

// defaultPool is the deployment's default storage pool: "default" when
// the host's pools have it, else the first of them.
func defaultPool(o Options) string {
	for _, spec := range o.StoragePools {
		if name, _, _ := strings.Cut(spec, "="); name == server.DefaultStoragePool {
			return name
		}
	}
	if len(o.StoragePools) > 0 {
		name, _, _ := strings.Cut(o.StoragePools[0], "=")
		return name
	}
	return server.DefaultStoragePool
}

// ParseResolvers parses a comma-separated list of IP or IP:port resolver
// addresses (port 53 when absent). The empty string gives nil.
func ParseResolvers(s string) ([]netip.AddrPort, error) {
	if s == "" {
		return nil, nil
	}
	var out []netip.AddrPort
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, netip.AddrPortFrom(a, 53))
			continue
		}
		ap, err := netip.ParseAddrPort(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not an IP address or IP:port", f)
		}
		out = append(out, ap)
	}
	return out, nil
}

// systemResolvers are the nameservers of /etc/resolv.conf.
func systemResolvers() []netip.AddrPort {
	conf, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil {
		slog.Warn("no deployment resolvers: workspaces' DNS will fail under PUBLIC_INTERNET", "err", err)
		return []netip.AddrPort{}
	}
	var out []netip.AddrPort
	for _, s := range conf.Servers {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, netip.AddrPortFrom(a.WithZone(""), 53))
		}
	}
	return out
}

// guestAgent finds the kibotos-guest binary.
func (o Options) guestAgent() (string, error) {
	if o.GuestAgent != "" {
		return o.GuestAgent, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	path := filepath.Join(filepath.Dir(exe), "kibotos-guest")
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("guest agent: %w (build it with make build, or pass --guest-agent)", err)
	}
	return path, nil
}

// hostCapacity measures what this machine offers: its cores and the memory
// the kernel reports, each times its overcommit, and the free space of the
// state directory.
func hostCapacity(layerDir string, pools []agent.StoragePool, over Overcommit) (*hostv1.HostCapacity, error) {
	mem, err := memTotal()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(layerDir, 0o700); err != nil {
		return nil, err
	}
	// The layers' room counts what their images (and the Volumes' beside
	// them) already hold: at a restart the free space alone misses it.
	var poolDirs []string
	for _, p := range pools {
		poolDirs = append(poolDirs, p.Dir)
	}
	return &hostv1.HostCapacity{
		CpuMillis:         uint32(float64(goruntime.NumCPU()*1000) * over.CPU),
		MemoryBytes:       uint64(float64(mem) * over.Memory),
		LayerBytes:        agent.Room(layerDir, poolDirs...),
		DefaultLayerBytes: DefaultLayerBytes,
	}, nil
}

func memTotal() (uint64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("MemTotal missing from /proc/meminfo")
}
