package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// start takes an execution from nothing to RUNNING: deliver the template's
// layers, create (or grow) the writable layer, create the network slot,
// and boot. A failure is reported FAILED with the stage it failed at, and
// releases what the attempt set up.
func (e *execution) start(ctx context.Context, as *hostv1.Assignment) {
	lock := e.agent.layerLock(as.LayerId)
	lock.Lock()
	defer lock.Unlock()
	fail := func(stage ctrlv1.FailureStage, err error) { e.fail(as, stage, err) }
	if !e.agent.offers(as.Launch) {
		e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_FAILED,
			FailureStage: ctrlv1.FailureStage_FAILURE_STAGE_STARTING, FailureReason: ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE,
			FailureMessage: fmt.Sprintf("this host does not offer the launch the workspace is bound to (%s, guest %s); "+
				"an explicit start binds it to its platform's current default", as.Launch.Platform, as.Launch.GuestBuild)})
		return
	}
	delivering := &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_DELIVERING}
	lastSent := time.Time{}
	layers, err := e.agent.deliver(ctx, as, func(done, total uint64) {
		if total == 0 {
			return // every layer was here: nothing to report
		}
		delivering.DeliveryBytesDelivered, delivering.DeliveryBytesTotal = done, total
		if time.Since(lastSent) > 200*time.Millisecond || done == total {
			lastSent = time.Now()
			e.report(as, proto.CloneOf(delivering))
		}
	})
	if err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_CREATING, fmt.Errorf("deliver template %s@%s: %w", as.Template.TemplateId, as.Template.Revision, err))
		return
	}
	path := e.agent.layerPath(as.LayerId)
	// A warm pool entry is RUNNING at once; it reports no STARTING before,
	// which would put one more call to ctrl on the way to AVAILABLE.
	if as.Restore == nil && as.Volume == nil && !exists(path) && e.bindPooled(ctx, as, layers) {
		return
	}
	e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_STARTING})
	if as.Restore != nil {
		if err := e.restore(ctx, as); err != nil {
			fail(ctrlv1.FailureStage_FAILURE_STAGE_CREATING, err)
			return
		}
	}
	continued := exists(path)
	if err := e.agent.cfg.Layers.CreateLayer(ctx, path, as.Resources.GetWritableLayerBytes()); err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_CREATING, fmt.Errorf("writable layer: %w", err))
		return
	}
	// ResizeWorkspaceWritableLayer grew the request while it was stopped.
	if err := e.agent.cfg.Layers.GrowLayer(ctx, path, as.Resources.GetWritableLayerBytes()); err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_RESIZING_WRITABLE_LAYER, fmt.Errorf("growing the writable layer: %w", err))
		return
	}
	if _, err := e.createSlot(as); err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_APPLYING_NETWORK, err)
		return
	}
	e.boot(ctx, as, layers, continued, "")
}

// boot starts the execution through the driver, in its network slot, on
// the template's layers, the writable layer and the Volume, and probes
// until the guest answers; it reports RUNNING, or FAILED once it has
// released what it set up, the slot included. bootID, when set, is the
// boot that started the execution (a restart: see restart.go). The
// layer's lock is held.
func (e *execution) boot(ctx context.Context, as *hostv1.Assignment, layers []string, continued bool, bootID string) {
	fail := func(stage ctrlv1.FailureStage, err error) {
		e.releaseSlot()
		e.fail(as, stage, err)
	}
	path := e.agent.layerPath(as.LayerId)
	// The guest writes to its layer from here on: the host's disk holds
	// all of it now, or the start fails rather than one of those writes.
	if err := e.agent.cfg.Layers.ReserveLayer(path); err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_STARTING, fmt.Errorf("writable layer: %w", err))
		return
	}
	var volume *runtime.VolumeMount
	if as.Volume != nil {
		image, unlock, stage, err := e.agent.vols.open(ctx, as.Volume)
		if err != nil {
			fail(stage, err)
			return
		}
		defer unlock() // once the execution has it mounted, nothing else can
		volume = &runtime.VolumeMount{Image: image, Path: as.Volume.MountPath}
	}
	// The guest agent boots with no CPU quota, and the workspace's applies
	// once it answers (as a warm pool entry's does when it is bound): at a
	// small quota its boot waited out whole CFS periods, 20 to 100 ms of a
	// start at 0.1 CPU.
	spec := runtime.Spec{
		ID: e.id, Layers: layers, LayerImage: path,
		MemoryBytes: as.Resources.GetMemoryBytes(), PidsLimit: pidsLimit,
		GuestAgent: e.agent.cfg.GuestAgent, Hostname: as.WorkspaceId, Env: as.Template.GetEnv(),
		NetNS: e.agent.netnsPath(e.id), ResolvConf: netslot.ResolvConf(e.agent.cfg.Network.DeploymentResolvers),
		Volume: volume,
	}
	if d := as.Template.GetDisplay(); d != nil {
		spec.Display = &guestabi.DisplaySize{Width: d.GetWidth(), Height: d.GetHeight()}
	}
	if err := e.agent.cfg.Driver.Start(ctx, spec); err != nil {
		fail(ctrlv1.FailureStage_FAILURE_STAGE_STARTING, err)
		return
	}
	e.setRunning(ctx, true)
	e.keepBoot(bootID)
	e.memory = spec.MemoryBytes
	abandon := func(stage ctrlv1.FailureStage, err error) {
		e.setRunning(ctx, false)
		e.agent.cfg.Driver.Stop(ctx, e.id, runtime.StopForce, 0)
		fail(stage, err)
	}
	probeCtx, cancel := context.WithTimeout(ctx, e.agent.readyTimeout)
	defer cancel()
	for {
		err := e.agent.cfg.Driver.Probe(probeCtx, e.id)
		if err == nil {
			break
		}
		if probeCtx.Err() != nil {
			abandon(ctrlv1.FailureStage_FAILURE_STAGE_WAITING_FOR_READINESS, fmt.Errorf("guest agent did not answer within %s: %w", e.agent.readyTimeout, err))
			return
		}
		time.Sleep(5 * time.Millisecond) // a probe that finds no socket yet costs next to nothing
	}
	if err := e.agent.cfg.Driver.SetCPU(ctx, e.id, as.Resources.GetCpuMillis()); err != nil {
		abandon(ctrlv1.FailureStage_FAILURE_STAGE_STARTING, fmt.Errorf("applying the CPU limit: %w", err))
		return
	}
	e.watchGuest(nil, time.Time{})
	capacity, _ := e.agent.cfg.Layers.LayerCapacity(path)
	e.report(as, e.withNetwork(&hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_RUNNING,
		LayerCapacityBytes: &capacity, LayerContinued: continued}))
}

// bindPooled starts a fresh execution without a Volume from a warm pool
// entry of its shape, if the pool has one: the entry takes the
// workspace's layer path, limits and hostname, and its slot the
// assignment's network. It reports false, having changed nothing, when
// the execution is to be built instead.
func (e *execution) bindPooled(ctx context.Context, as *hostv1.Assignment, layers []string) bool {
	ent := e.agent.pool.take(e.agent.pool.shapeOf(as, layers))
	if ent == nil {
		return false
	}
	b := runtime.Binding{LayerImage: e.agent.layerPath(as.LayerId), Hostname: as.WorkspaceId,
		CPUMillis: as.Resources.GetCpuMillis(), MemoryBytes: as.Resources.GetMemoryBytes(), PidsLimit: pidsLimit}
	if err := e.agent.pool.bind(ctx, e.id, ent, b); err != nil {
		slog.Error("binding a warm pool entry; starting without it", "execution", e.id, "entry", ent.rid, "err", err)
		return false
	}
	ent.owner.Store(e)
	ent.slot.Apply(as.Network)
	e.setSlot(ent.slot)
	e.setRunning(ctx, true)
	e.memory = b.MemoryBytes
	e.watchGuest(&ent.check, ent.checkedAt)
	capacity, _ := e.agent.cfg.Layers.LayerCapacity(b.LayerImage)
	e.report(as, e.withNetwork(&hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_RUNNING,
		LayerCapacityBytes: &capacity}))
	return true
}

// exists reports whether something is at path.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// fail reports that the execution failed at stage.
func (e *execution) fail(as *hostv1.Assignment, stage ctrlv1.FailureStage, err error) {
	slog.Error("execution failed to start", "execution", e.id, "err", err)
	e.report(as, &hostv1.ExecutionReport{State: hostv1.ObservedState_OBSERVED_STATE_FAILED,
		FailureStage: stage, FailureReason: reasonOf(err), FailureMessage: e.agent.publicMessage(err)})
}

// offers reports whether the host runs executions with launch: one of its
// launches equals it. An assignment without a launch runs with any.
func (a *Agent) offers(launch *hostv1.Launch) bool {
	return launch == nil || slices.ContainsFunc(a.cfg.Launches, func(l *hostv1.Launch) bool { return proto.Equal(l, launch) })
}
