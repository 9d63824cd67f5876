package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/diskimage"
)

// volumeID is the shape of the Volume IDs ctrl issues (internal/ids), so
// that no assignment can name a file outside its pool's directory.
var volumeID = regexp.MustCompile(`^vol_[a-z0-9]+$`)

// volumeCheckEvery is how often the agent looks at every Volume image it
// is assigned, converging it and observing its condition.
const volumeCheckEvery = 5 * time.Second

// StoragePool is a storage pool the host reaches: a directory of Volume
// images, one file per Volume.
type StoragePool struct {
	Name string
	Dir  string
	// DefaultVolumeBytes is the pool's profile: the capacity of a Volume
	// created without one.
	DefaultVolumeBytes uint64
	// onlineGrow is nil when an image of the pool can grow while mounted,
	// else why not (probed at start).
	onlineGrow error
}

// volumes converges the host's Volume images to ctrl's volume
// assignments and keeps the latest observation of each.
type volumes struct {
	agent *Agent
	pools map[string]*StoragePool

	mu      sync.Mutex
	desired map[string]*hostv1.VolumeAssignment
	last    map[string]*hostv1.VolumeReport
	// locks serialize the work on one image: converging it, and mounting
	// it for an execution.
	locks sync.Map // volume ID → *sync.Mutex
	wake  chan struct{}
}

func newVolumes(a *Agent, pools []StoragePool) (*volumes, error) {
	v := &volumes{agent: a, pools: map[string]*StoragePool{}, desired: map[string]*hostv1.VolumeAssignment{},
		last: map[string]*hostv1.VolumeReport{}, wake: make(chan struct{}, 1)}
	for i := range pools {
		p := pools[i]
		if err := os.MkdirAll(p.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("storage pool %s: %w", p.Name, err)
		}
		v.pools[p.Name] = &p
	}
	return v, nil
}

// probe finds out, per pool, whether images can grow while mounted.
func (v *volumes) probe(ctx context.Context) {
	for _, p := range v.pools {
		p.onlineGrow = diskimage.ProbeOnlineGrow(ctx, p.Dir)
		if p.onlineGrow != nil {
			slog.Info("storage pool: volumes grow only while no execution mounts them", "pool", p.Name, "why", p.onlineGrow)
		}
	}
}

// registration describes the pools for RegisterHost.
func (v *volumes) registration() []*hostv1.StoragePool {
	var out []*hostv1.StoragePool
	for _, p := range v.pools {
		sp := &hostv1.StoragePool{Name: p.Name, DefaultVolumeBytes: p.DefaultVolumeBytes, OnlineGrow: p.onlineGrow == nil,
			CapacityBytes: proto.Uint64(Room(p.Dir, v.agent.cfg.LayerDir)), SharesLayerFilesystem: sameFilesystem(p.Dir, v.agent.cfg.LayerDir)}
		if p.onlineGrow != nil {
			// Callers read it (a refused resize quotes it): it names no
			// host path.
			sp.OnlineGrowRefusal = strings.ReplaceAll(p.onlineGrow.Error(), p.Dir, "<pool "+p.Name+">")
		}
		out = append(out, sp)
	}
	return out
}

// sameFilesystem reports whether directories a and b are on one
// filesystem; false when either cannot be read.
func sameFilesystem(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}

// Room is what a directory of sparse images can give them: the free
// space of its filesystem plus the blocks the images already take there,
// its own and those in the other directories on that filesystem (layers
// and Volumes share one by default, and ctrl counts each kind's
// reservations against the other's room). Zero when dir cannot be read.
func Room(dir string, others ...string) uint64 {
	var fs unix.Statfs_t
	if unix.Statfs(dir, &fs) != nil {
		return 0
	}
	room := fs.Bavail * uint64(fs.Bsize)
	for _, d := range append([]string{dir}, others...) {
		if d != dir && !sameFilesystem(d, dir) {
			continue
		}
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if !e.Type().IsRegular() {
				continue
			}
			if info, err := e.Info(); err == nil {
				if st, ok := info.Sys().(*syscall.Stat_t); ok {
					room += uint64(st.Blocks) * 512
				}
			}
		}
	}
	return room
}

// set replaces the desired set.
func (v *volumes) set(assignments []*hostv1.VolumeAssignment) {
	v.mu.Lock()
	v.desired = map[string]*hostv1.VolumeAssignment{}
	for _, a := range assignments {
		v.desired[a.VolumeId] = a
	}
	for id := range v.last {
		if v.desired[id] == nil {
			delete(v.last, id) // ctrl wants nothing of it any more
		}
	}
	v.mu.Unlock()
	select {
	case v.wake <- struct{}{}:
	default:
	}
}

func (v *volumes) assignment(id string) *hostv1.VolumeAssignment {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.desired[id]
}

func (v *volumes) lock(id string) *sync.Mutex {
	m, _ := v.locks.LoadOrStore(id, new(sync.Mutex))
	return m.(*sync.Mutex)
}

// damagedVolumeError refuses a start because its Volume's image does not
// open as the Volume created: the Volume's data, not the platform, is at
// fault, so the failure is FAILURE_REASON_UNAVAILABLE, not INTERNAL.
type damagedVolumeError string

func (e damagedVolumeError) Error() string { return string(e) }

// path is where a Volume's image lives.
func (v *volumes) path(pool, id string) (string, error) {
	p := v.pools[pool]
	if p == nil {
		return "", fmt.Errorf("this host does not reach storage pool %q", pool)
	}
	if !volumeID.MatchString(id) {
		return "", fmt.Errorf("volume ID %q is not one ctrl issues", id)
	}
	return filepath.Join(p.Dir, id+".ext4"), nil
}

// run converges every assigned Volume when the set changes and
// periodically, until ctx ends.
func (v *volumes) run(ctx context.Context) {
	for {
		v.mu.Lock()
		var ids []string
		for id := range v.desired {
			ids = append(ids, id)
		}
		v.mu.Unlock()
		for _, id := range ids {
			if ctx.Err() != nil {
				return
			}
			m := v.lock(id)
			m.Lock()
			if a := v.assignment(id); a != nil {
				v.converge(ctx, a)
			}
			m.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-v.wake:
		case <-time.After(volumeCheckEvery):
		}
	}
}

// converge takes one Volume image toward its assignment and reports what
// it then observes; the Volume's lock is held. It returns the image's
// path when the image is present and opens as the Volume.
func (v *volumes) converge(ctx context.Context, a *hostv1.VolumeAssignment) (string, error) {
	rep := &hostv1.VolumeReport{VolumeId: a.VolumeId}
	defer func() { v.report(rep) }()
	path, err := v.path(a.StoragePool, a.VolumeId)
	if err != nil {
		rep.FailureStage, rep.FailureMessage = ctrlv1.FailureStage_FAILURE_STAGE_CREATING_VOLUME, v.agent.publicMessage(err)
		return "", err
	}
	inUse := len(diskimage.LoopsOf(path)) > 0
	rep.Attached = inUse
	if a.Desired == hostv1.VolumeDesired_VOLUME_DESIRED_DELETED {
		if inUse {
			return "", nil // deleted once the execution that mounts it is gone
		}
		if err := diskimage.Delete(path); err != nil {
			rep.FailureStage, rep.FailureMessage = ctrlv1.FailureStage_FAILURE_STAGE_DELETING_VOLUME, v.agent.publicMessage(err)
			return "", err
		}
		rep.Deleted = true
		return "", nil
	}
	info, err := diskimage.Inspect(path)
	if errors.Is(err, os.ErrNotExist) && a.Restoring {
		return "", errors.New("the volume is being restored from a transfer") // by its execution's start
	}
	if errors.Is(err, os.ErrNotExist) && a.Create {
		if err := diskimage.Create(ctx, path, a.CapacityBytes, a.FilesystemUuid); err != nil {
			rep.FailureStage, rep.FailureMessage = ctrlv1.FailureStage_FAILURE_STAGE_CREATING_VOLUME, v.agent.publicMessage(err)
			return "", fmt.Errorf("creating volume %s: %w", a.VolumeId, err)
		}
		info, err = diskimage.Inspect(path)
	}
	if err == nil && info.UUID != a.FilesystemUuid {
		err = fmt.Errorf("the image holds filesystem %s, not the volume's %s", info.UUID, a.FilesystemUuid)
	}
	if errors.Is(err, os.ErrNotExist) {
		// Its pool's directory was emptied or replaced (a host back on a
		// new disk): say what an operator can do, as the error alone
		// reads like a fault of the platform.
		err = fmt.Errorf("its image is missing from storage pool %q on host %s; put the image back, or, "+
			"if the pool's data is gone for good, an operator declares it lost (kibotos admin pool lost %s --host %s)",
			a.StoragePool, v.agent.cfg.HostID, a.StoragePool, v.agent.cfg.HostID)
	}
	if err != nil {
		rep.Condition = ctrlv1.VolumeCondition_VOLUME_CONDITION_DAMAGED
		rep.Error = fmt.Sprintf("volume %s cannot be opened as the volume created: %v", a.VolumeId, err)
		return "", damagedVolumeError(rep.Error)
	}
	if info.Capacity() < a.CapacityBytes {
		if err := v.grow(ctx, a, path, inUse); err != nil {
			rep.FailureStage, rep.FailureMessage = ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_VOLUME, v.agent.publicMessage(err)
		} else if info, err = diskimage.Inspect(path); err != nil {
			rep.FailureStage, rep.FailureMessage = ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_VOLUME, v.agent.publicMessage(err)
		}
	}
	rep.Condition = ctrlv1.VolumeCondition_VOLUME_CONDITION_HEALTHY
	rep.CapacityBytes = info.Capacity()
	rep.UsedBytes = v.used(ctx, a.VolumeId, info)
	return path, nil
}

// grow grows an image: offline when nothing mounts it, online when an
// execution does and the pool allows it; otherwise it waits for the
// execution to end (ctrl admits such a resize only where it can run).
func (v *volumes) grow(ctx context.Context, a *hostv1.VolumeAssignment, path string, inUse bool) error {
	if !inUse {
		return diskimage.Grow(ctx, path, a.CapacityBytes)
	}
	if v.pools[a.StoragePool].onlineGrow != nil {
		return nil
	}
	devs := diskimage.LoopsOf(path)
	if len(devs) != 1 {
		return fmt.Errorf("volume %s is attached to %d loop devices", a.VolumeId, len(devs))
	}
	if err := diskimage.GrowOnline(ctx, path, devs[0], a.CapacityBytes); err != nil {
		return err
	}
	return diskimage.Reserve(path) // its guest may write to the new blocks at once
}

// used is how much of a Volume its data uses: from the execution that
// mounts it, else from the image's superblock.
func (v *volumes) used(ctx context.Context, id string, info diskimage.Info) uint64 {
	if execID := v.agent.executionMounting(id); execID != "" {
		if used, _, err := v.agent.cfg.Driver.VolumeUsage(ctx, execID); err == nil {
			return used
		}
	}
	return info.DataBytes
}

// report records a Volume's observation and sends it when it changed.
func (v *volumes) report(rep *hostv1.VolumeReport) {
	v.mu.Lock()
	if v.desired[rep.VolumeId] == nil {
		v.mu.Unlock()
		return
	}
	prev := v.last[rep.VolumeId]
	v.last[rep.VolumeId] = rep
	v.mu.Unlock()
	if prev != nil && proto.Equal(prev, rep) {
		return
	}
	rep = proto.CloneOf(rep)
	rep.ObservedAt = timestamppb.Now()
	select {
	case v.agent.volumeReports <- rep:
	default:
		slog.Warn("volume report queue full; the next heartbeat carries the state", "volume", rep.VolumeId)
	}
}

// latest returns the latest observation of every assigned Volume.
func (v *volumes) latest() []*hostv1.VolumeReport {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]*hostv1.VolumeReport, 0, len(v.last))
	for _, r := range v.last {
		r = proto.CloneOf(r)
		r.ObservedAt = timestamppb.Now()
		out = append(out, r)
	}
	return out
}

// open makes an execution's Volume image ready to mount: created when its
// assignment allows, grown, and opened as the Volume. The returned unlock
// must be called once the execution has mounted it (or failed to).
func (v *volumes) open(ctx context.Context, ev *hostv1.ExecutionVolume) (path string, unlock func(), stage ctrlv1.FailureStage, err error) {
	m := v.lock(ev.VolumeId)
	m.Lock()
	a := v.assignment(ev.VolumeId)
	if a == nil || a.Desired != hostv1.VolumeDesired_VOLUME_DESIRED_PRESENT {
		m.Unlock()
		return "", nil, ctrlv1.FailureStage_FAILURE_STAGE_STARTING, fmt.Errorf("volume %s is not assigned to this host", ev.VolumeId)
	}
	stage = ctrlv1.FailureStage_FAILURE_STAGE_STARTING
	if a.Create {
		stage = ctrlv1.FailureStage_FAILURE_STAGE_CREATING_VOLUME
	}
	path, err = v.converge(ctx, a)
	if err == nil {
		// The guest writes to it from here on (see ReserveLayer).
		if err = diskimage.Reserve(path); err != nil {
			err = fmt.Errorf("volume %s: %w", ev.VolumeId, err)
		}
	}
	if err != nil {
		m.Unlock()
		return "", nil, stage, err
	}
	return path, m.Unlock, stage, nil
}
