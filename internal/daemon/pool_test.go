package daemon_test

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/nettest"
	"github.com/kibotos/kibotos/internal/testutil/promtest"
)

// poolEntry returns the runtime ID of the warm pool entry that serves the
// execution id, if one does.
func (d *deployment) poolEntry(id string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(d.home, "layers", ".pool", "bound", id))
	return string(b), err == nil
}

// awaitPoolReady waits until the host's warm pool holds n entries ready
// to be handed out (kibotos_host_warm_pool_ready).
func (d *deployment) awaitPoolReady(n int) {
	d.t.Helper()
	eventually(d.t, 60*time.Second, fmt.Sprintf("%d warm pool entries ready", n), func() (float64, error) {
		ready, _ := promtest.Scrape(d.t, http.DefaultClient, d.url, "").Value("kibotos_host_warm_pool_ready")
		return ready, nil
	}, func(ready float64) bool { return ready >= float64(n) })
}

// insideView is what the guest sees of itself: its hostname (also as
// /etc/hostname and /etc/hosts tell it), its limits
// (memory, CFS quota and burst, pids) through its own cgroups, the sizes
// of /tmp and /run, the files of /root (the writable layer's) and whether
// the template's files are there.
const insideView = `hostname; cat /proc/sys/kernel/hostname
cat /etc/hostname /etc/hosts
cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null
cpu() { cat /sys/fs/cgroup/cpu,cpuacct/cpu.cfs_$1_us /sys/fs/cgroup/cpu/cpu.cfs_$1_us 2>/dev/null | head -1; }
echo $(cpu quota) $(cpu burst)
cat /sys/fs/cgroup/pids/pids.max
df -k /tmp /run | awk 'NR>1 {print $2}'
ls -A /root
test -x /bin/busybox && test -x /usr/bin/wget && echo template files present`

// TestWarmPool: with a warm pool, the first fresh start of a shape is
// built and the pool fills with that shape; the next workspaces are bound
// to its entries and are indistinguishable from the built one from the
// inside (hostname, memory, CPU and pids limits, tmpfs sizes, the
// template's files, a layer with nothing of another workspace's), their
// network policy is in force (DENY_ALL refuses, PUBLIC_INTERNET reaches a
// test host, a deny entry refuses it again), and a workspace bound after
// another one wrote and was deleted finds none of its files.
func TestWarmPool(t *testing.T) {
	e := newNetEnvWith(t, daemon.Options{DeploymentResolvers: []netip.AddrPort{netip.AddrPortFrom(nettest.HostIPv4, 53)}, WarmPool: 2})
	cold := e.ws
	if _, ok := e.poolEntry(fmt.Sprintf("%s-1", cold.WorkspaceId)); ok {
		t.Fatal("the first start of a shape was bound to a pool entry")
	}
	e.awaitPoolReady(2)

	// Another CPU limit than the entries were started with: the binding
	// sets it.
	spec := small()
	spec.Resources.CpuMillis = 250
	ws := e.create(spec)
	ws = e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	rid, ok := e.poolEntry(ws.WorkspaceId + "-1")
	if !ok {
		t.Fatal("the workspace was not bound to a pool entry")
	}
	if best := testutil.RetentionTier(ws, ctrlv1.RetentionTierKind_RETENTION_TIER_KIND_BEST_EFFORT); ws.Generation != 1 || best.GetCapacityBytes() != 64*mib ||
		best.Continuity != ctrlv1.RetentionContinuity_RETENTION_CONTINUITY_RESET {
		t.Errorf("bound workspace: generation %d, tier %v", ws.Generation, best)
	}
	for _, w := range []*ctrlv1.Workspace{cold, ws} {
		if image := filepath.Join(e.home, "layers", w.WorkspaceId+".ext4"); !heldInFull(t, image) {
			t.Errorf("the layer of %s is not held in full on the host's disk", w.WorkspaceId)
		}
	}
	want, err := e.exec(cold, "sh", "-c", insideView)
	if err != nil {
		t.Fatalf("the built workspace's view: %v %s", err, want)
	}
	got, err := e.exec(ws, "sh", "-c", insideView)
	if err != nil {
		t.Fatalf("the bound workspace's view: %v %s", err, got)
	}
	if strings.Replace(strings.ReplaceAll(got, ws.WorkspaceId, "HOST"), "\n25000 25000\n", "\n50000 50000\n", 1) != strings.ReplaceAll(want, cold.WorkspaceId, "HOST") ||
		!strings.HasPrefix(got, ws.WorkspaceId+"\n"+ws.WorkspaceId+"\n") || strings.Contains(got, rid) {
		t.Errorf("the bound workspace sees\n%s\nthe built one\n%s", got, want)
	}
	for _, limit := range []string{"134217728\n", "\n25000 25000\n", "4096\n", "template files present",
		"\n" + ws.WorkspaceId + "\n127.0.0.1\tlocalhost\n127.0.1.1\t" + ws.WorkspaceId + "\n"} {
		if !strings.Contains(got, limit) {
			t.Errorf("the bound workspace's view lacks %q:\n%s", limit, got)
		}
	}

	v4 := net.JoinHostPort(nettest.HostIPv4.String(), fmt.Sprint(e.v4.port))
	e.ws = ws
	e.awaitApplied(1)
	if e.talk(v4) {
		t.Fatal("DENY_ALL let a connection of the bound workspace out")
	}
	e.setPolicy(public(nil))
	if !e.talk(v4) {
		t.Fatal("PUBLIC_INTERNET did not reach the test host from the bound workspace")
	}
	e.setPolicy(public(func(p *ctrlv1.NetworkPolicy) { p.Deny = []string{"198.51.100.0/24"} }))
	if e.talk(v4) {
		t.Error("a denied destination was reached from the bound workspace")
	}

	if out, err := e.exec(ws, "sh", "-c", "echo secret > /root/secret && mkdir -p /opt/left && sync"); err != nil {
		t.Fatalf("write: %v %s", err, out)
	}
	mustUnary(t, e.client.DeleteWorkspace, &ctrlv1.DeleteWorkspaceRequest{Command: cmd(), WorkspaceId: ws.WorkspaceId})
	e.await(ws.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
	if _, ok := e.poolEntry(ws.WorkspaceId + "-1"); ok {
		t.Error("the alias of a deleted workspace is left")
	}
	if _, err := os.Stat(filepath.Join(e.home, "runtime", "exec", rid)); !os.IsNotExist(err) {
		t.Errorf("the entry of a deleted workspace is left: %v", err)
	}
	e.awaitPoolReady(2)
	next := e.await(e.create(small()).WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	if _, ok := e.poolEntry(next.WorkspaceId + "-1"); !ok {
		t.Fatal("the next workspace was not bound to a pool entry")
	}
	if out, err := e.exec(next, "sh", "-c", "ls -A /root; ls -d /opt/left 2>&1; hostname"); err != nil ||
		strings.Contains(out, "secret") || !strings.Contains(out, "No such file") || !strings.HasSuffix(out, next.WorkspaceId+"\n") {
		t.Errorf("the next workspace sees %q, %v", out, err)
	}
}
