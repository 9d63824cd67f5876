package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protojson"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/host/runtime"
	"github.com/kibotos/kibotos/internal/host/runtime/oci"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk/bearer"
)

const mib = 1 << 20

// crashPoint is one row of TestCrashTable: an operation of the deployment
// during which `kibotos up` is killed with SIGKILL.
type crashPoint struct {
	name string
	// delays are the kill points: how long after the operation began the
	// deployment is killed, one kill and restart each.
	delays []time.Duration
	// seed prepares what the operation works on, once per row.
	seed func(d *deployment) *seeded
	// begin starts the operation; the kill follows after the delay.
	begin func(d *deployment, s *seeded)
	// killed checks what the dead deployment left on disk, before the
	// restart; may be nil.
	killed func(d *deployment, s *seeded)
	// recovered waits until the restarted deployment has finished the
	// operation and checks that every object is in a state the seed allows.
	recovered func(d *deployment, s *seeded)
}

// seeded is what a row's seed made: the Workspace, Volume and Template it
// works on and the digest of the data synced before the kill.
type seeded struct {
	ws, vol, template string
	digest            string // sha256sum output of the synced file
	capacity          uint64 // of the volume, grown by each kill point
	upload            string // local file `ws cp` uploads
	uploaded          string // its sha256sum output in the guest
	archive           string // local image archive `template import` sends
	layerKiB          uint64 // size of the root filesystem, before growth
	artifact          string // local transfer artifact `transfer import` sends
}

// TestCrashTable kills `kibotos up` with SIGKILL during each operation that
// changes the host, at several points, starts it again, and checks that
// states are truthful (every object ends in a state its seed allows, pending
// work finishes), data synced before the kill is intact, and once every
// object is deleted and the deployment stopped, the host holds nothing of
// them: no container, mount, loop device, cgroup, network namespace,
// process, file, or layer no template references.
func TestCrashTable(t *testing.T) { runCrashTable(t, crashTable()) }

// runCrashTable runs the rows of a crash table, each on a deployment of
// its own.
func runCrashTable(t *testing.T, rows []crashPoint) {
	hosttest.RequireRoot(t)
	bin := build(t)
	killPoints := 0
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			d := newDeployment(t, bin)
			s := row.seed(d)
			for _, delay := range row.delays {
				row.begin(d, s)
				time.Sleep(delay)
				d.up.kill()
				killPoints++
				if row.killed != nil {
					row.killed(d, s)
				}
				d.start()
				row.recovered(d, s)
				d.checkContainers()
			}
			d.deleteAllAndScan()
		})
	}
	t.Logf("kill points tried: %d", killPoints)
}

func crashTable() []crashPoint {
	// seedWorkspace creates a workspace, optionally with a new volume, and
	// writes and syncs 4 MiB of random data in its writable layer.
	seedWorkspace := func(volume bool) func(d *deployment) *seeded {
		return func(d *deployment) *seeded {
			s := &seeded{ws: d.createWorkspace(volume)}
			if volume {
				s.vol = d.workspace(s.ws).Spec.GetVolume().GetVolumeId()
				s.capacity = 64 * mib
			}
			s.digest = d.cli("ws", "exec", s.ws, "--", "sh", "-c", "head -c 4194304 /dev/urandom > /root/blob && sync && sha256sum /root/blob")
			return s
		}
	}
	stopped := func(seed func(d *deployment) *seeded) func(d *deployment) *seeded {
		return func(d *deployment) *seeded {
			s := seed(d)
			d.cli("ws", "stop", s.ws, "--wait")
			return s
		}
	}
	return []crashPoint{{
		name:   "create",
		delays: []time.Duration{0, 300 * time.Millisecond},
		seed:   func(*deployment) *seeded { return &seeded{} },
		begin: func(d *deployment, s *seeded) {
			s.ws = d.createWorkspaceAsync()
		},
		recovered: func(d *deployment, s *seeded) {
			ws := d.awaitWorkspace(s.ws, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
			if ws.Generation != 1 {
				d.t.Errorf("the new workspace is at generation %d", ws.Generation)
			}
			d.cli("ws", "exec", s.ws, "--", "true")
		},
	}, {
		name:   "start",
		delays: []time.Duration{0, 300 * time.Millisecond},
		seed:   stopped(seedWorkspace(false)),
		begin: func(d *deployment, s *seeded) {
			d.cli("ws", "start", s.ws)
		},
		recovered: func(d *deployment, s *seeded) {
			d.awaitWorkspace(s.ws, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
			d.checkBlob(s)
			d.cli("ws", "stop", s.ws, "--wait")
		},
	}, {
		name:   "stop",
		delays: []time.Duration{0, 300 * time.Millisecond},
		seed:   seedWorkspace(false),
		begin: func(d *deployment, s *seeded) {
			// A guest process that ignores SIGTERM holds a NORMAL stop in
			// STOPPING for the whole grace period, when the kill comes.
			ws := d.workspace(s.ws)
			if out, err := d.driver().Exec(context.Background(), fmt.Sprintf("%s-%d", s.ws, ws.Generation),
				"sh", "-c", "(trap '' TERM; exec sleep 600) </dev/null >/dev/null 2>&1 &"); err != nil {
				d.t.Fatalf("start a stubborn process: %v %s", err, out)
			}
			d.cli("ws", "stop", s.ws)
			if got := d.workspace(s.ws).State; got != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPING {
				d.t.Fatalf("before the kill, the workspace is %v, want STOPPING", got)
			}
		},
		recovered: func(d *deployment, s *seeded) {
			ws := d.awaitWorkspace(s.ws, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
			if ws.LastStop.GetCompletedAt() == nil {
				d.t.Errorf("the stop finished without completion: %v", ws.LastStop)
			}
			d.cli("ws", "start", s.ws, "--wait")
			d.checkBlob(s)
		},
	}, {
		name:   "delete",
		delays: []time.Duration{0, 200 * time.Millisecond},
		seed:   func(*deployment) *seeded { return &seeded{} },
		begin: func(d *deployment, s *seeded) {
			s.ws = d.createWorkspace(true)
			s.vol = d.workspace(s.ws).Spec.GetVolume().GetVolumeId()
			d.cli("ws", "delete", s.ws)
		},
		recovered: func(d *deployment, s *seeded) {
			d.awaitWorkspace(s.ws, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED)
			d.awaitVolumeGone(s.vol)
			testutil.AssertNothingLeft(d.t, d.home, s.ws)
			testutil.AssertNothingLeft(d.t, d.home, s.vol)
		},
	}, {
		name:   "layer growth",
		delays: []time.Duration{0, 300 * time.Millisecond},
		seed: func(d *deployment) *seeded {
			s := seedWorkspace(false)(d)
			s.layerKiB = d.rootKiB(s.ws)
			d.cli("ws", "stop", s.ws, "--wait")
			return s
		},
		begin: func(d *deployment, s *seeded) {
			ws := d.workspace(s.ws)
			grown := ws.Spec.Resources.WritableLayerBytes + 32*mib
			d.cli("ws", "disk", s.ws, formatMiB(grown))
			d.cli("ws", "start", s.ws)
		},
		recovered: func(d *deployment, s *seeded) {
			ws := d.awaitWorkspace(s.ws, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
			// The filesystem is the layer's size less ext4's own metadata,
			// and larger than before.
			total := d.rootKiB(s.ws)
			if want := ws.Spec.Resources.WritableLayerBytes / 1024; total > want || total <= s.layerKiB {
				d.t.Errorf("the grown layer holds %d KiB: it held %d, and is given %d", total, s.layerKiB, want)
			}
			s.layerKiB = total
			d.checkBlob(s)
			d.cli("ws", "stop", s.ws, "--wait")
		},
	}, {
		name:   "volume growth",
		delays: []time.Duration{0, 15 * time.Millisecond, 50 * time.Millisecond, 120 * time.Millisecond, 400 * time.Millisecond},
		seed: func(d *deployment) *seeded {
			s := seedWorkspace(true)(d)
			s.digest = d.cli("ws", "exec", s.ws, "--", "sh", "-c", "head -c 16777216 /dev/urandom > /data/blob && sync && sha256sum /data/blob")
			d.cli("ws", "stop", s.ws, "--wait")
			return s
		},
		begin: func(d *deployment, s *seeded) {
			d.cli("volume", "resize", s.vol, formatMiB(s.capacity+256*mib))
		},
		killed: func(d *deployment, s *seeded) {
			// The image is the old or the new size and checks clean.
			image := filepath.Join(d.home, "volumes", s.vol+".ext4")
			fi, err := os.Stat(image)
			if err != nil {
				d.t.Fatal(err)
			}
			if size := uint64(fi.Size()); size != s.capacity && size != s.capacity+256*mib {
				d.t.Fatalf("the image is %d bytes, neither %d nor %d", size, s.capacity, s.capacity+256*mib)
			}
			if out, err := exec.Command("e2fsck", "-fn", image).CombinedOutput(); err != nil {
				d.t.Fatalf("e2fsck: %v\n%s", err, out)
			}
		},
		recovered: func(d *deployment, s *seeded) {
			s.capacity += 256 * mib
			d.awaitVolume(s.vol, func(v *ctrlv1.Volume) bool {
				return v.State == ctrlv1.VolumeState_VOLUME_STATE_AVAILABLE && v.Spec.CapacityBytes == s.capacity
			})
			if left, _ := filepath.Glob(filepath.Join(d.home, "volumes", "."+s.vol+".ext4.tmp-*")); len(left) > 0 {
				d.t.Errorf("temporary images left: %v", left)
			}
			d.cli("ws", "start", s.ws, "--wait")
			if got := d.cli("ws", "exec", s.ws, "--", "sha256sum", "/data/blob"); got != s.digest {
				d.t.Errorf("the volume's data reads %q, want %q", got, s.digest)
			}
			d.cli("ws", "stop", s.ws, "--wait")
		},
	}, {
		name:   "file upload",
		delays: []time.Duration{100 * time.Millisecond, 400 * time.Millisecond},
		seed: func(d *deployment) *seeded {
			s := seedWorkspace(false)(d)
			s.upload = filepath.Join(d.t.TempDir(), "upload")
			if err := os.WriteFile(s.upload, bytes.Repeat([]byte("0123456789abcdef"), mib), 0o644); err != nil {
				d.t.Fatal(err)
			}
			d.cli("ws", "exec", s.ws, "--", "sh", "-c", "echo old > /root/upload && sync")
			return s
		},
		begin: func(d *deployment, s *seeded) {
			d.background("ws", "cp", s.upload, s.ws+":/root/upload")
		},
		recovered: func(d *deployment, s *seeded) {
			if ws := d.awaitWorkspace(s.ws, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE); ws.Generation != 1 {
				d.t.Errorf("the running workspace restarted: generation %d", ws.Generation)
			}
			// The write is atomic: the old file or the whole new one, and
			// no temporary file beside it.
			got := d.cli("ws", "exec", s.ws, "--", "sh", "-c", "sha256sum < /root/upload; ls -a /root")
			want, _ := exec.Command("sh", "-c", "sha256sum < "+s.upload).Output()
			old, _ := exec.Command("sh", "-c", "echo old | sha256sum").Output()
			sum, list, _ := strings.Cut(got, "\n")
			switch sum + "\n" {
			case string(want):
				d.t.Log("the killed upload had finished: the file is the new one")
			case string(old):
				d.t.Log("the kill cut the upload: the file is the old one")
			default:
				d.t.Errorf("after a killed upload the file's sha256 is %s, neither the old nor the new one", sum)
			}
			for _, name := range strings.Fields(list) {
				if name != "." && name != ".." && name != "blob" && name != "upload" && !strings.HasPrefix(name, ".ash") {
					d.t.Errorf("left in /root after a killed upload: %s", name)
				}
			}
			d.checkBlob(s)
		},
	}, {
		name:   "template import",
		delays: []time.Duration{50 * time.Millisecond, 300 * time.Millisecond, 800 * time.Millisecond},
		seed: func(d *deployment) *seeded {
			return &seeded{archive: writeImageArchive(d.t)}
		},
		begin: func(d *deployment, s *seeded) {
			// Each kill point imports into a template of its own.
			s.template = fmt.Sprintf("crash-%d", len(d.ids))
			d.ids = append(d.ids, s.template)
			d.cli("template", "create", s.template)
			d.background("template", "import", s.template, s.archive)
		},
		recovered: func(d *deployment, s *seeded) {
			// The revision is there in full or not at all, and an import
			// the kill cut can be done again.
			if len(d.template(s.template).Revisions) == 0 {
				d.t.Log("the kill cut the import: no revision")
				d.cli("template", "import", s.template, s.archive)
			} else {
				d.t.Log("the killed import had finished: the revision is there")
			}
			if n := len(d.template(s.template).Revisions); n != 1 {
				d.t.Errorf("the template has %d revisions after a killed import and a retry, want 1", n)
			}
		},
	}}
}

// deployment is one `kibotos up` on its own home, restarted after each
// kill, with the IDs of everything a row created.
type deployment struct {
	t    *testing.T
	bin  string
	home string
	up   *upProcess
	ids  []string // workspaces, volumes and templates created
	jobs []*exec.Cmd
}

func newDeployment(t *testing.T, bin string) *deployment {
	d := &deployment{t: t, bin: bin, home: filepath.Join(t.TempDir(), "home")}
	// Runs after the process is stopped: release whatever a failure left
	// running, so that no container, mount or loop device outlives the test.
	t.Cleanup(func() {
		for _, job := range d.jobs {
			job.Wait()
		}
		drv, err := oci.New(oci.Config{StateDir: filepath.Join(d.home, "runtime")})
		if err != nil {
			return
		}
		for _, id := range d.containers() {
			drv.Stop(context.Background(), id, runtime.StopForce, 0)
		}
	})
	d.start()
	return d
}

// start runs `kibotos up` on the deployment's home.
func (d *deployment) start() {
	d.up = startUp(d.t, d.bin, d.home, "--volume-size", "64Mi")
}

// cli runs the CLI of the real binary and returns its stdout.
func (d *deployment) cli(args ...string) string {
	d.t.Helper()
	return runCLI(d.t, d.bin, d.home, d.up.addr, args...)
}

// background starts the CLI without waiting for it: the kill cuts it.
func (d *deployment) background(args ...string) {
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), "KIBOTOS_HOME="+d.home, "KIBOTOS_ADDR="+d.up.addr)
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	d.jobs = append(d.jobs, cmd)
}

func (d *deployment) createWorkspace(volume bool) string {
	args := []string{"ws", "create", "--memory", "128Mi", "--disk", "64Mi", "--wait", "-o", "json"}
	if volume {
		args = append(args, "--volume", "NEW")
	}
	var created ctrlv1.CreateWorkspaceResponse
	if err := protojson.Unmarshal([]byte(d.cli(args...)), &created); err != nil {
		d.t.Fatal(err)
	}
	d.ids = append(d.ids, created.Workspace.WorkspaceId)
	if v := created.Workspace.Spec.GetVolume().GetVolumeId(); v != "" {
		d.ids = append(d.ids, v)
	}
	return created.Workspace.WorkspaceId
}

// createWorkspaceAsync asks for a workspace and returns at once: the host
// agent is delivering or starting it.
func (d *deployment) createWorkspaceAsync() string {
	var created ctrlv1.CreateWorkspaceResponse
	if err := protojson.Unmarshal([]byte(d.cli("ws", "create", "--memory", "128Mi", "--disk", "64Mi", "-o", "json")), &created); err != nil {
		d.t.Fatal(err)
	}
	d.ids = append(d.ids, created.Workspace.WorkspaceId)
	return created.Workspace.WorkspaceId
}

func (d *deployment) workspaces() ctrlv1connect.WorkspaceServiceClient {
	return ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, "http://"+d.up.addr, d.auth())
}

func (d *deployment) volumes() ctrlv1connect.VolumeServiceClient {
	return ctrlv1connect.NewVolumeServiceClient(http.DefaultClient, "http://"+d.up.addr, d.auth())
}

func (d *deployment) templates() ctrlv1connect.TemplateServiceClient {
	return ctrlv1connect.NewTemplateServiceClient(http.DefaultClient, "http://"+d.up.addr, d.auth())
}

func (d *deployment) auth() connect.ClientOption {
	return connect.WithInterceptors(bearer.Token(adminToken(d.t, d.home)))
}

func (d *deployment) template(id string) *ctrlv1.Template {
	d.t.Helper()
	resp, err := d.templates().GetTemplate(context.Background(), connect.NewRequest(&ctrlv1.GetTemplateRequest{TemplateId: id}))
	if err != nil {
		d.t.Fatalf("GetTemplate %s: %v", id, err)
	}
	return resp.Msg.Template
}

func (d *deployment) driver() *oci.Driver {
	drv, err := oci.New(oci.Config{StateDir: filepath.Join(d.home, "runtime")})
	if err != nil {
		d.t.Fatal(err)
	}
	return drv
}

func (d *deployment) workspace(id string) *ctrlv1.Workspace {
	d.t.Helper()
	resp, err := d.workspaces().GetWorkspace(context.Background(), connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
	if err != nil {
		d.t.Fatalf("GetWorkspace %s: %v", id, err)
	}
	return resp.Msg.Workspace
}

// convergeWithin bounds how long the restarted deployment may take to
// finish pending work; it is a deadline for a hang, not a measure.
const convergeWithin = 90 * time.Second

// awaitWorkspace waits until the workspace is in state want; it fails when
// it settles in another state (FAILED, or STOPPED while waiting for
// AVAILABLE) rather than wait the whole deadline.
func (d *deployment) awaitWorkspace(id string, want ctrlv1.WorkspaceState) *ctrlv1.Workspace {
	d.t.Helper()
	for deadline := time.Now().Add(convergeWithin); ; time.Sleep(100 * time.Millisecond) {
		ws := d.workspace(id)
		if ws.State == want {
			return ws
		}
		if ws.State == ctrlv1.WorkspaceState_WORKSPACE_STATE_FAILED || time.Now().After(deadline) {
			d.t.Fatalf("workspace %s is %v (failure %v), want %v", id, ws.State, ws.Failure, want)
		}
	}
}

func (d *deployment) awaitVolume(id string, ok func(*ctrlv1.Volume) bool) *ctrlv1.Volume {
	d.t.Helper()
	for deadline := time.Now().Add(convergeWithin); ; time.Sleep(100 * time.Millisecond) {
		resp, err := d.volumes().GetVolume(context.Background(), connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: id}))
		var vol *ctrlv1.Volume
		if err == nil {
			if vol = resp.Msg.Volume; ok(vol) {
				return vol
			}
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("volume %s: %v, %v", id, vol, err)
		}
	}
}

// awaitVolumeGone waits until the volume is DELETED or no longer found.
func (d *deployment) awaitVolumeGone(id string) {
	d.t.Helper()
	for deadline := time.Now().Add(convergeWithin); ; time.Sleep(100 * time.Millisecond) {
		resp, err := d.volumes().GetVolume(context.Background(), connect.NewRequest(&ctrlv1.GetVolumeRequest{VolumeId: id}))
		if connect.CodeOf(err) == connect.CodeNotFound || (err == nil && resp.Msg.Volume.State == ctrlv1.VolumeState_VOLUME_STATE_DELETED) {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("volume %s is not deleted: %v, %v", id, resp, err)
		}
	}
}

// rootKiB is the size of the workspace's root filesystem as df reports it.
func (d *deployment) rootKiB(ws string) uint64 {
	d.t.Helper()
	var total uint64
	if f := strings.Fields(d.cli("ws", "exec", ws, "--", "sh", "-c", "df -k / | tail -1")); len(f) > 1 {
		fmt.Sscan(f[1], &total)
	}
	return total
}

// checkBlob checks that the data the seed wrote and synced is intact.
func (d *deployment) checkBlob(s *seeded) {
	d.t.Helper()
	if got := d.cli("ws", "exec", s.ws, "--", "sha256sum", "/root/blob"); got != s.digest {
		d.t.Errorf("the synced data reads %q, want %q", got, s.digest)
	}
}

// containers lists the runc containers of the deployment.
func (d *deployment) containers() []string {
	out, _ := exec.Command("runc", "--root", filepath.Join(d.home, "runtime", "runc"), "list", "-q").Output()
	return strings.Fields(string(out))
}

// checkContainers checks that exactly the workspaces that run have a
// container, each of its current generation (under the runtime ID of the
// warm pool entry it was bound to, if it was); the warm pool's other
// entries are no workspace's.
func (d *deployment) checkContainers() {
	d.t.Helper()
	want := map[string]bool{}
	for _, id := range d.ids {
		if !strings.HasPrefix(id, "ws_") {
			continue
		}
		switch ws := d.workspace(id); ws.State {
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE:
			exec := fmt.Sprintf("%s-%d", id, ws.Generation)
			if rid, err := os.ReadFile(filepath.Join(d.home, "layers", ".pool", "bound", exec)); err == nil {
				exec = string(rid)
			}
			want[exec] = true
		case ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED, ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED:
		default:
			d.t.Errorf("workspace %s is %v once the restarted deployment settled", id, ws.State)
		}
	}
	have := d.containers()
	for _, id := range have {
		if !want[id] && !strings.HasPrefix(id, "pool-") {
			d.t.Errorf("container %s runs, but no workspace wants it", id)
		}
		delete(want, id)
	}
	for id := range want {
		d.t.Errorf("workspace execution %s is AVAILABLE without a container", id)
	}
}

// deleteAllAndScan deletes every object the row created, stops the
// deployment, and scans the host for anything left of them.
func (d *deployment) deleteAllAndScan() {
	d.t.Helper()
	ctx := context.Background()
	for _, id := range d.ids {
		if strings.HasPrefix(id, "ws_") && d.workspace(id).State != ctrlv1.WorkspaceState_WORKSPACE_STATE_DELETED {
			d.cli("ws", "delete", id, "--wait")
		}
	}
	resp, err := d.volumes().ListVolumes(ctx, connect.NewRequest(&ctrlv1.ListVolumesRequest{}))
	if err != nil {
		d.t.Fatal(err)
	}
	for _, v := range resp.Msg.Volumes {
		if v.State != ctrlv1.VolumeState_VOLUME_STATE_DELETED && v.State != ctrlv1.VolumeState_VOLUME_STATE_DELETING {
			d.cli("volume", "delete", v.VolumeId, "--wait")
		}
		d.awaitVolumeGone(v.VolumeId)
		d.ids = append(d.ids, v.VolumeId)
	}
	templates, err := d.templates().ListTemplates(ctx, connect.NewRequest(&ctrlv1.ListTemplatesRequest{}))
	if err != nil {
		d.t.Fatal(err)
	}
	for _, tpl := range templates.Msg.Templates {
		if tpl.TemplateId != "base" {
			d.cli("template", "delete", tpl.TemplateId)
		}
	}
	// The deployment collects template bytes that no revision uses at
	// start, sparing those written within the last hour, as an import in
	// flight: age what is unreferenced past that, and restart.
	store := filepath.Join(d.home, "templates")
	referenced := d.referencedDigests()
	old := unix.NsecToTimespec(time.Now().Add(-2 * time.Hour).UnixNano())
	times := []unix.Timespec{old, old}
	for _, dir := range []string{filepath.Join(store, "blobs", "sha256"), filepath.Join(store, "tmp")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if referenced[e.Name()] {
				continue
			}
			// Never through a symlink: an unpacked layer's links name
			// paths of the guest, which on the host are the host's.
			filepath.Walk(filepath.Join(dir, e.Name()), func(path string, _ os.FileInfo, err error) error {
				if err == nil {
					unix.UtimesNanoAt(unix.AT_FDCWD, path, times, unix.AT_SYMLINK_NOFOLLOW)
				}
				return nil
			})
		}
	}
	d.up.stop()
	d.start()
	d.checkLayersReferenced()
	if left, _ := os.ReadDir(filepath.Join(store, "tmp")); len(left) > 0 {
		d.t.Errorf("temporary files of imports left: %v", left)
	}
	// The warm pool refills with the shape it kept; its entries no
	// workspace has bound are no workspace's, and the stop releases them.
	bound, _ := os.ReadDir(filepath.Join(d.home, "layers", ".pool", "bound"))
	for _, id := range d.containers() {
		if !strings.HasPrefix(id, "pool-") || len(bound) > 0 {
			d.t.Errorf("container %s runs with every workspace deleted (bound entries: %d)", id, len(bound))
		}
	}
	if code := d.up.stop(); code != 0 {
		d.t.Errorf("kibotos up exited with %d after SIGTERM", code)
	}
	for _, job := range d.jobs {
		job.Wait()
	}
	d.jobs = nil

	for _, id := range d.ids {
		testutil.AssertNothingLeft(d.t, d.home, id)
	}
	// Nothing mounted under the home (netns files, layers, volumes), no
	// loop device on a file in it, no network namespace file left, and no
	// process of the binaries the test built.
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mounts), "\n") {
			if strings.Contains(line, d.home) {
				d.t.Errorf("left mounted: %s", line)
			}
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		if b, _ := os.ReadFile(l); strings.HasPrefix(string(b), d.home) {
			d.t.Errorf("loop device left: %s on %s", l, b)
		}
	}
	if left, _ := os.ReadDir(filepath.Join(d.home, "netns")); len(left) > 0 {
		d.t.Errorf("network namespace files left: %v", left)
	}
	binDir := filepath.Dir(d.bin)
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if exe, err := os.Readlink(p + "/exe"); err == nil && strings.HasPrefix(exe, binDir+"/") {
			d.t.Errorf("process left: %s is %s", p, exe)
		}
		cgroup, _ := os.ReadFile(p + "/cgroup")
		for _, id := range d.ids {
			if !bytes.Contains(cgroup, []byte(id)) {
				continue
			}
			// A guest agent whose parent, the killed deployment, is gone
			// was handed to init, and its exit status is init's to reap:
			// a zombie of init holds nothing but its PID.
			stat, _ := os.ReadFile(p + "/stat")
			if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 1 && f[0] == "Z" && f[1] == "1" {
				d.t.Logf("%s, an exited process of %s, waits for init to reap it", p, id)
				continue
			}
			cmdline, _ := os.ReadFile(p + "/cmdline")
			d.t.Errorf("process left in the cgroup of %s: %s %q (stat %s)", id, p, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), stat)
		}
	}
}

// referencedDigests returns the hex digests of what the revisions of the
// templates that exist use: their manifests, configs and layers.
func (d *deployment) referencedDigests() map[string]bool {
	d.t.Helper()
	resp, err := d.templates().ListTemplates(context.Background(), connect.NewRequest(&ctrlv1.ListTemplatesRequest{}))
	if err != nil {
		d.t.Fatal(err)
	}
	store := filepath.Join(d.home, "templates")
	referenced := map[string]bool{}
	for _, tpl := range resp.Msg.Templates {
		for _, rev := range tpl.Revisions {
			for _, digest := range imageDigests(d.t, store, rev.ImageDigest) {
				referenced[strings.TrimPrefix(digest, "sha256:")] = true
			}
		}
	}
	return referenced
}

// checkLayersReferenced checks that every blob and unpacked layer in the
// template store belongs to a revision of a template that exists.
func (d *deployment) checkLayersReferenced() {
	d.t.Helper()
	store := filepath.Join(d.home, "templates")
	referenced := d.referencedDigests()
	for _, dir := range []string{"blobs", "layers"} {
		ents, _ := os.ReadDir(filepath.Join(store, dir, "sha256"))
		for _, e := range ents {
			if hex, _, _ := strings.Cut(e.Name(), "."); !referenced[hex] {
				d.t.Errorf("%s/sha256/%s belongs to no template revision", dir, e.Name())
			}
		}
	}
}

// imageDigests returns the digests an image's manifest names: itself, its
// config, its layer blobs and their uncompressed diff IDs.
func imageDigests(t *testing.T, store, manifestDigest string) []string {
	read := func(digest string, v any) {
		b, err := os.ReadFile(filepath.Join(store, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:")))
		if err == nil {
			err = json.Unmarshal(b, v)
		}
		if err != nil {
			t.Errorf("blob %s of a stored revision: %v", digest, err)
		}
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	read(manifestDigest, &manifest)
	var config struct {
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	read(manifest.Config.Digest, &config)
	digests := append([]string{manifestDigest, manifest.Config.Digest}, config.RootFS.DiffIDs...)
	for _, l := range manifest.Layers {
		digests = append(digests, l.Digest)
	}
	return digests
}

// writeImageArchive writes a docker-save archive of an amd64 image of
// three 4 MiB random layers, large enough for a kill to cut its import.
func writeImageArchive(t *testing.T) string {
	img, err := random.Image(4*mib, 3)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config = v1.Config{Cmd: []string{"/bin/sh"}}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(path, name.MustParseReference("kibotos.test/crash:latest"), img); err != nil {
		t.Fatal(err)
	}
	return path
}

// runCLI runs the kibotos CLI against the deployment on home and addr and
// returns its stdout; a failure fails the test.
func runCLI(t *testing.T, bin, home, addr string, args ...string) string {
	t.Helper()
	// A restarted deployment answers the data plane of a workspace it adopts
	// with unavailable ("retry once it runs") until its host agent has reported
	// the execution again; a process start refused so started nothing, and
	// is retried as a caller would.
	retryUnavailable := len(args) > 1 && args[0] == "ws" && args[1] == "exec"
	deadline := time.Now().Add(time.Minute)
	for {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "KIBOTOS_HOME="+home, "KIBOTOS_ADDR="+addr)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err == nil {
			return stdout.String()
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatal(err)
		}
		if retryUnavailable && strings.HasPrefix(stderr.String(), "kibotos: unavailable:") && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		t.Fatalf("kibotos %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
}

// formatMiB is a size as the CLI takes it.
func formatMiB(n uint64) string { return fmt.Sprintf("%dMi", n/mib) }
