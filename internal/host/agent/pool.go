package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/netslot"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// The warm pool keeps executions started ahead of time for the latest
// shape of start the host served (template layers, environment, display,
// memory, layer size): each entry has its network slot (no policy: it
// refuses every connection), a fresh writable layer image, its mounts and
// its guest agent answering, under a runtime ID of its own ("pool-…") and
// a placeholder hostname. A fresh start of that shape without a Volume or
// a restore binds an entry instead of building one (runtime.Binder: the
// layer image moves to the workspace's path, the limits and hostname are
// set), applies the policy to the slot, and from then on the execution's
// ID stands for the entry's runtime ID in every driver call and for its
// network namespace (aliasDriver, netnsPath). The alias is kept in a file
// per execution until its slot is released, so a restarted agent adopts a
// bound execution under its ID; unbound entries it finds are released.
//
// Entries are not known to ctrl, whose placement counts them as free: the
// pool fills only while the memory of the executions assigned here and of
// its entries fits the host's capacity, and evicts entries as soon as it
// does not (or when the wanted shape changes).

// DefaultWarmPool is the pool size the host's flag defaults to: two
// entries serve a caller creating workspaces one after another (one is
// handed out while the next is made) at the cost of two idle guest agents
// and two slots; bursts larger than the pool take the built path.
const DefaultWarmPool = 2

// MaxWarmPool bounds the pool size.
const MaxWarmPool = 256

// poolPrefix starts the runtime ID of every pool entry; ctrl's execution
// IDs start with their workspace's ID ("ws_…"), never with it.
const poolPrefix = "pool-"

// maxFills is how many entries the pool starts at once: a pool taken
// faster than one start takes runs dry with one at a time, and more
// would only share the cores further.
const maxFills = 2

// poolRetry is how long a failed fill waits before it tries again.
const poolRetry = 5 * time.Second

// refillHold is how long a take that leaves a ready entry holds the
// refill back. The bound workspace's first calls (its RUNNING report and
// the caller's session and first process) follow within milliseconds,
// and a refill beside them shares the cores with its runc run and the
// host filesystem's journal with its mkfs and syncs: every sync the
// create waits for (the bind's record, ctrl's commits) waited for the
// refill's writes too. A take that empties the pool refills at once, and
// so does one that comes within rapidTakes of the one before: creates
// that follow each other that fast drain the pool, and a hold would only
// leave it empty for the next.
const refillHold = 30 * time.Millisecond

// rapidTakes is how close together takes are for their refills not to be
// held: about the hold and a refill's start.
const rapidTakes = 200 * time.Millisecond

// poolShape is what the entries of the pool are started with.
type poolShape struct {
	key        string
	spec       runtime.Spec // without ID, LayerImage, Hostname, NetNS
	layerBytes uint64
	diffIDs    []string // the template's layers, kept from collection
}

// pooled is one entry of the pool.
type pooled struct {
	rid   string
	shape *poolShape
	image string // where its layer image is until it is bound
	slot  *netslot.Slot
	// check is the guest's answer that made the entry ready, at checkedAt.
	check     runtime.GuestCheck
	checkedAt time.Time
	// owner is the execution bound to the entry; its slot's changes are
	// reported through it.
	owner atomic.Pointer[execution]
}

func (p *pooled) changed() {
	if e := p.owner.Load(); e != nil {
		e.resendRunning()
	}
}

// warmPool is the host's pool of executions started ahead of time. A nil
// pool (an Agent made without New) serves every execution by its own ID.
type warmPool struct {
	a      *Agent
	size   int
	binder runtime.Binder // nil: the driver cannot bind, the pool stays empty
	// dir is the pool's directory: shapeFile, aliasDir (one file per bound
	// execution, named by its ID and holding the runtime ID) and images
	// (the entries' layer images).
	dir, aliasDir, images string

	mu      sync.Mutex
	shape   *poolShape
	ready   []*pooled
	filling []*poolShape      // the shapes of the entries being started (fill)
	aliases map[string]string // execution ID → runtime ID
	// hold and rapid are refillHold and rapidTakes; holdUntil is when
	// fills may start again after a take; lastTake is when the last take
	// was.
	hold, rapid time.Duration
	holdUntil   time.Time
	lastTake    time.Time
	wake        chan struct{}
}

func newWarmPool(a *Agent, size int, dir string, inner runtime.Driver) (*warmPool, error) {
	p := &warmPool{a: a, size: size, dir: dir, aliasDir: filepath.Join(dir, "bound"), images: filepath.Join(dir, "images"),
		aliases: map[string]string{}, hold: refillHold, rapid: rapidTakes, wake: make(chan struct{}, 1)}
	p.binder, _ = inner.(runtime.Binder)
	for _, d := range []string{p.aliasDir, p.images} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	p.shape = p.loadShape()
	return p, nil
}

// readyCount is how many entries are ready to be handed out.
func (p *warmPool) readyCount() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

// enabled reports whether the pool may hold entries.
func (p *warmPool) enabled() bool { return p.size > 0 && p.binder != nil }

// kick wakes the fill loop.
func (p *warmPool) kick() {
	if p == nil {
		return
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// runtimeID returns the runtime ID that serves an execution.
func (p *warmPool) runtimeID(id string) string {
	if p == nil {
		return id
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if rid, ok := p.aliases[id]; ok {
		return rid
	}
	return id
}

// shapeOf returns the shape of a fresh start of as on layers.
func (p *warmPool) shapeOf(as *hostv1.Assignment, layers []string) *poolShape {
	spec := runtime.Spec{
		Layers: layers, CPUMillis: as.Resources.GetCpuMillis(), MemoryBytes: as.Resources.GetMemoryBytes(), PidsLimit: pidsLimit,
		GuestAgent: p.a.cfg.GuestAgent, Env: as.Template.GetEnv(), ResolvConf: netslot.ResolvConf(p.a.cfg.Network.DeploymentResolvers),
	}
	if d := as.Template.GetDisplay(); d != nil {
		spec.Display = &guestabi.DisplaySize{Width: d.GetWidth(), Height: d.GetHeight()}
	}
	s := &poolShape{spec: spec, layerBytes: as.Resources.GetWritableLayerBytes()}
	for _, l := range as.GetTemplate().GetLayers() {
		s.diffIDs = append(s.diffIDs, l.GetDiffId())
	}
	s.key = s.keyOf()
	return s
}

// keyOf is what tells shapes apart: what a start asks for, not what the
// host adds.
func (s *poolShape) keyOf() string {
	return fmt.Sprintf("%q %q %v %d %d", s.spec.Layers, s.spec.Env, s.spec.Display, s.spec.MemoryBytes, s.layerBytes)
}

// shapeFile is where the wanted shape is kept across the agent's
// restarts, under the pool's directory: the next agent fills the pool at
// once instead of after the next start built without it.
const shapeFile = "shape.json"

// savedShape is a shape as shapeFile keeps it: what a start asked for
// (poolShape.keyOf), without what this host adds, set again when read.
type savedShape struct {
	Layers     []string
	CPUMillis  uint32
	Memory     uint64
	Env        []string
	Display    *guestabi.DisplaySize
	LayerBytes uint64
	DiffIDs    []string
}

// saveShape keeps s as the wanted shape; a failure only costs the next
// agent its head start.
func (p *warmPool) saveShape(s *poolShape) {
	b, err := json.Marshal(savedShape{Layers: s.spec.Layers, CPUMillis: s.spec.CPUMillis, Memory: s.spec.MemoryBytes,
		Env: s.spec.Env, Display: s.spec.Display, LayerBytes: s.layerBytes, DiffIDs: s.diffIDs})
	if err == nil {
		path := filepath.Join(p.dir, shapeFile)
		if err = os.WriteFile(path+".tmp", b, 0o600); err == nil {
			err = os.Rename(path+".tmp", path)
		}
	}
	if err != nil {
		slog.Warn("warm pool: keeping the wanted shape", "err", err)
	}
}

// loadShape returns the shape an earlier agent kept, with this host's
// guest agent, resolvers and limits; nil when there is none or a layer of
// it is gone.
func (p *warmPool) loadShape() *poolShape {
	b, err := os.ReadFile(filepath.Join(p.dir, shapeFile))
	if err != nil {
		return nil
	}
	var saved savedShape
	if err := json.Unmarshal(b, &saved); err != nil || len(saved.Layers) == 0 {
		return nil
	}
	for _, l := range saved.Layers {
		if _, err := os.Stat(l); err != nil {
			return nil
		}
	}
	s := &poolShape{spec: runtime.Spec{Layers: saved.Layers, CPUMillis: saved.CPUMillis, MemoryBytes: saved.Memory, PidsLimit: pidsLimit,
		GuestAgent: p.a.cfg.GuestAgent, Env: saved.Env, Display: saved.Display, ResolvConf: netslot.ResolvConf(p.a.cfg.Network.DeploymentResolvers)},
		layerBytes: saved.LayerBytes, diffIDs: saved.DiffIDs}
	s.key = s.keyOf()
	return s
}

// take returns a ready entry of the shape, making it the wanted one; nil
// when there is none.
func (p *warmPool) take(s *poolShape) *pooled {
	if !p.enabled() {
		return nil
	}
	defer p.kick()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shape == nil || p.shape.key != s.key {
		p.shape = s
		p.saveShape(s)
		return nil
	}
	i := slices.IndexFunc(p.ready, func(e *pooled) bool { return e.shape.key == s.key })
	if i < 0 {
		return nil
	}
	ent := p.ready[i]
	p.ready = slices.Delete(p.ready, i, i+1)
	now := time.Now()
	p.holdUntil = time.Time{}
	if now.Sub(p.lastTake) > p.rapid && slices.ContainsFunc(p.ready, func(e *pooled) bool { return e.shape.key == s.key }) {
		p.holdUntil = now.Add(p.hold)
	}
	p.lastTake = now
	return ent
}

// bind hands ent to the execution id with b; on error ent is released
// and nothing of it is left at b.LayerImage.
func (p *warmPool) bind(ctx context.Context, id string, ent *pooled, b runtime.Binding) error {
	// An entry's layer is sparse while it waits, holding back no disk a
	// placement needs; the workspace's layer is held in full, as a built
	// one is.
	err := p.a.cfg.Layers.ReserveLayer(ent.image)
	if err == nil {
		err = p.binder.Bind(ctx, ent.rid, b)
	}
	if err == nil {
		err = p.setAlias(id, ent.rid)
	}
	if err != nil {
		p.release(ctx, ent)
		p.a.cfg.Layers.DeleteLayer(b.LayerImage)
		return err
	}
	ent.slot.SetHostAddresses(interfaceAddresses())
	return nil
}

// setAlias records that the runtime ID rid serves the execution id.
func (p *warmPool) setAlias(id, rid string) error {
	path := filepath.Join(p.aliasDir, id)
	if err := os.WriteFile(path+".tmp", []byte(rid), 0o600); err != nil {
		return err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return err
	}
	p.mu.Lock()
	p.aliases[id] = rid
	p.mu.Unlock()
	return nil
}

// dropAlias forgets the runtime ID of the execution id, once nothing of
// the execution runs and its slot is released.
func (p *warmPool) dropAlias(id string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	_, ok := p.aliases[id]
	delete(p.aliases, id)
	p.mu.Unlock()
	if ok {
		if err := os.Remove(filepath.Join(p.aliasDir, id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			slog.Error("removing the alias of a pooled execution", "execution", id, "err", err)
		}
	}
}

// layersInUse returns the DiffIDs of the layers the pool runs or fills
// with.
func (p *warmPool) layersInUse() []string {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	if p.shape != nil {
		ids = append(ids, p.shape.diffIDs...)
	}
	for _, e := range p.ready {
		ids = append(ids, e.shape.diffIDs...)
	}
	return ids
}

// run fills the pool until ctx ends, then releases its entries.
func (p *warmPool) run(ctx context.Context) {
	var fills sync.WaitGroup
	defer func() {
		fills.Wait()
		p.drain()
	}()
	for ctx.Err() == nil {
		if hold := p.held(); hold > 0 {
			select {
			case <-ctx.Done():
			case <-p.wake: // a take may have ended the hold
			case <-time.After(hold):
			}
			continue
		}
		p.evict(ctx)
		if s := p.next(); s != nil {
			fills.Go(func() { p.fill(ctx, s) })
			continue
		}
		select {
		case <-ctx.Done():
		case <-p.wake:
		case <-time.After(10 * time.Second):
		}
	}
}

// held returns how long fills are still held back after a take.
func (p *warmPool) held() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Until(p.holdUntil)
}

// fill starts one entry of s, counted in p.filling until it is ready; a
// failed fill holds its place for poolRetry, so that failures do not
// follow each other at once. An entry whose shape is no longer wanted
// when it is ready is released rather than kept.
func (p *warmPool) fill(ctx context.Context, s *poolShape) {
	defer p.kick()
	ent, err := p.create(ctx, s)
	if err != nil {
		if ctx.Err() == nil {
			slog.Error("filling the warm pool", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(poolRetry):
		}
	}
	p.mu.Lock()
	i := slices.Index(p.filling, s)
	p.filling = slices.Delete(p.filling, i, i+1)
	wanted := err == nil && s == p.shape
	if wanted {
		p.ready = append(p.ready, ent)
	}
	p.mu.Unlock()
	if err == nil && !wanted {
		p.release(ctx, ent)
	}
}

// committedMemory is the memory of the executions assigned to run here.
func (a *Agent) committedMemory() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var sum uint64
	for _, e := range a.execs {
		if as, _ := e.get(); as.GetDesired() == hostv1.DesiredState_DESIRED_STATE_RUNNING {
			sum += as.Resources.GetMemoryBytes()
		}
	}
	return sum
}

// fits reports whether n entries of memory bytes each fit beside the
// executions assigned here.
func (p *warmPool) fits(n int, memory uint64) bool {
	capacity := p.a.cfg.Capacity.GetMemoryBytes()
	return capacity == 0 || p.a.committedMemory()+uint64(n)*memory <= capacity
}

// next returns the shape to start one more entry of, counting it in
// p.filling; nil when the pool is full (ready and starting entries of the
// wanted shape), has no room, or maxFills fills run already.
func (p *warmPool) next() *poolShape {
	if !p.enabled() {
		return nil
	}
	p.mu.Lock()
	s, filling, n := p.shape, len(p.filling), len(p.ready)
	for _, f := range p.filling {
		if f == s {
			n++
		}
	}
	p.mu.Unlock()
	// fits takes the agent's lock: not under p.mu. Only run calls next,
	// so nothing else adds to p.filling meanwhile.
	if s == nil || n >= p.size || filling >= maxFills || !p.fits(n+1, s.spec.MemoryBytes) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// A take since run found no hold may have set one: it holds this
	// fill too.
	if time.Until(p.holdUntil) > 0 {
		return nil
	}
	p.filling = append(p.filling, s)
	return s
}

// evict releases the entries of a shape no longer wanted, and then the
// newest entries until the rest fit beside the assigned executions.
func (p *warmPool) evict(ctx context.Context) {
	p.mu.Lock()
	var out []*pooled
	p.ready = slices.DeleteFunc(p.ready, func(e *pooled) bool {
		if e.shape != p.shape {
			out = append(out, e)
			return true
		}
		return false
	})
	keep := slices.Clone(p.ready) // take may change p.ready meanwhile
	p.mu.Unlock()
	for len(keep) > 0 && !p.fits(len(keep), keep[0].shape.spec.MemoryBytes) {
		keep = keep[:len(keep)-1]
	}
	p.mu.Lock()
	for _, e := range p.ready {
		if !slices.Contains(keep, e) {
			out = append(out, e)
		}
	}
	p.ready = slices.DeleteFunc(p.ready, func(e *pooled) bool { return slices.Contains(out, e) })
	p.mu.Unlock()
	for _, e := range out {
		p.release(ctx, e)
	}
}

// create starts one entry of s and waits until its guest answers.
func (p *warmPool) create(ctx context.Context, s *poolShape) (_ *pooled, err error) {
	var b [8]byte
	rand.Read(b[:])
	ent := &pooled{rid: poolPrefix + hex.EncodeToString(b[:]), shape: s}
	ent.image = filepath.Join(p.images, ent.rid+".ext4")
	a := p.a
	defer func() {
		if err != nil {
			p.release(ctx, ent)
		}
	}()
	if err := a.cfg.Layers.CreateLayer(ctx, ent.image, s.layerBytes); err != nil {
		return nil, fmt.Errorf("writable layer: %w", err)
	}
	path := a.netnsPath(ent.rid)
	if ent.slot, err = netslot.Create(netslot.Config{Path: path, HardDeny: a.hardDeny(), CheckEndpoint: a.checkEndpoint,
		DeploymentResolvers: a.cfg.Network.DeploymentResolvers, Changed: ent.changed, Counters: &a.counters.slots}); err != nil {
		return nil, err
	}
	spec := s.spec
	spec.ID, spec.LayerImage, spec.Hostname, spec.NetNS = ent.rid, ent.image, ent.rid, path
	// No CPU quota until Bind sets the workspace's: only the guest agent
	// runs before, and at a small quota its boot waits out whole CFS
	// periods (a refill at 0.1 CPU took over 200 ms, most of it throttled).
	spec.CPUMillis = 0
	if err := a.driver.Start(ctx, spec); err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, a.readyTimeout)
	defer cancel()
	for {
		c, err := a.driver.CheckGuest(pctx, ent.rid)
		if err == nil && c.ProbeErr == nil {
			ent.check, ent.checkedAt = c, time.Now()
			// The data plane's first call through the gateway, once the
			// entry is bound, finds its connection open (unless the entry
			// waited longer than the connection's idle timeout).
			a.warmConnection(ctx, ent.rid)
			return ent, nil
		}
		if err == nil {
			err = c.ProbeErr
		}
		if pctx.Err() != nil {
			return nil, fmt.Errorf("guest agent did not answer within %s: %w", a.readyTimeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// release stops an entry and removes its slot and (unbound) layer image.
func (p *warmPool) release(ctx context.Context, ent *pooled) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var errs []error
	_, err := p.a.driver.Stop(ctx, ent.rid, runtime.StopForce, 0)
	errs = append(errs, err)
	if ent.slot != nil {
		errs = append(errs, ent.slot.Destroy())
	}
	errs = append(errs, p.a.cfg.Layers.DeleteLayer(ent.image))
	if err := errors.Join(errs...); err != nil {
		slog.Error("releasing a warm pool entry", "entry", ent.rid, "err", err)
	}
}

// drain releases every ready entry (the agent is ending).
func (p *warmPool) drain() {
	p.mu.Lock()
	out := p.ready
	p.ready = nil
	p.mu.Unlock()
	for _, e := range out {
		p.release(context.Background(), e)
	}
}

// recover adopts the aliases of bound executions that still run (running
// lists runtime IDs), releases the entries no execution was bound to and
// their images, and returns the execution IDs of the running ones.
func (p *warmPool) recover(ctx context.Context, running []string) ([]string, error) {
	ents, err := os.ReadDir(p.aliasDir)
	if err != nil {
		return running, err
	}
	byRID := map[string]string{}
	for _, ent := range ents {
		id := ent.Name()
		b, err := os.ReadFile(filepath.Join(p.aliasDir, id))
		rid := string(b)
		if err != nil || strings.HasSuffix(id, ".tmp") || !slices.Contains(running, rid) {
			os.Remove(filepath.Join(p.aliasDir, id))
			continue
		}
		byRID[rid] = id
		p.mu.Lock()
		p.aliases[id] = rid
		p.mu.Unlock()
	}
	var out []string
	var errs []error
	for _, rid := range running {
		switch id, bound := byRID[rid]; {
		case bound:
			out = append(out, id)
		case strings.HasPrefix(rid, poolPrefix):
			if _, err := p.a.driver.Stop(ctx, rid, runtime.StopForce, 0); err != nil {
				errs = append(errs, err)
			}
		default:
			out = append(out, rid)
		}
	}
	images, _ := os.ReadDir(p.images)
	for _, img := range images {
		errs = append(errs, p.a.cfg.Layers.DeleteLayer(filepath.Join(p.images, img.Name())))
	}
	return out, errors.Join(errs...)
}
