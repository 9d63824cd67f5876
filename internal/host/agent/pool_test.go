package agent

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/gen/kibotos/data/v1/datav1connect"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
)

// poolIDs returns the pool entries the driver runs.
func (e *reconcilerEnv) poolIDs() []string {
	return slices.DeleteFunc(e.driver.IDs(), func(id string) bool { return !strings.HasPrefix(id, poolPrefix) })
}

// awaitPool waits until the driver runs n pool entries.
func (e *reconcilerEnv) awaitPool(t *testing.T, n int) {
	t.Helper()
	eventually(t, "the warm pool holds the entries", func() bool { return len(e.poolIDs()) == n })
}

// awaitReady waits until a's pool holds n ready entries: the driver runs
// an entry (awaitPool) before its guest has answered and it can be bound.
func (e *reconcilerEnv) awaitReady(t *testing.T, a *Agent, n int) {
	t.Helper()
	eventually(t, "the warm pool's entries are ready", func() bool {
		a.pool.mu.Lock()
		defer a.pool.mu.Unlock()
		return len(a.pool.ready) == n
	})
}

// TestWarmPoolBind: the first fresh start of a shape is built and makes
// the pool fill with that shape, each entry's guest connection opened
// while it waits; the next one binds an entry, reported RUNNING and
// nothing before, whose first data-plane call takes that connection (the layer
// image moves to the workspace's path, hostname, limits and policy are the
// workspace's, the ID that stands for it is the execution's) and the pool
// refills; a stop releases the entry's runtime ID and namespace and keeps
// the layer, and the next start of the workspace is built on that layer.
func TestWarmPoolBind(t *testing.T) {
	e := newReconcilerEnv(t)
	e.cfg.WarmPool = 2
	// The fake serves each connection with a server of its own, which
	// tells the connections apart. The warm-up of a connection is a
	// StartProcess of warmUpProgram, which the guest refuses.
	var mu sync.Mutex
	greeted := map[*http.Server]string{} // the connection's warm-up, by the runtime ID it went to
	var lastCall *http.Server
	var warmUps [][]string // the args of every StartProcess
	warmUp := warmUpGuest{started: func(args []string) {
		mu.Lock()
		warmUps = append(warmUps, args)
		mu.Unlock()
	}}
	_, starts := datav1connect.NewProcessServiceHandler(warmUp)
	e.driver.ServeDataPlane(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn := r.Context().Value(http.ServerContextKey).(*http.Server)
		if r.URL.Path == datav1connect.ProcessServiceStartProcessProcedure {
			mu.Lock()
			greeted[conn] = r.Host
			mu.Unlock()
			starts.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		lastCall = conn
		mu.Unlock()
		http.NotFound(w, r)
	}))
	greetings := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(greeted)
	}
	a, _ := e.runAgent(t, e.driver)
	first := e.assignment("ws_a", 1, "lay_a")
	e.running(t, first)
	if _, _, ok := e.driver.Spec(first.ExecutionId); !ok {
		t.Fatal("the first start of a shape was not built under its own ID")
	}
	e.awaitPool(t, 2)
	eventually(t, "each entry's guest connection is opened", func() bool { return greetings() == 2 })
	// An entry's warm-up comes before it joins the ready entries.
	e.awaitReady(t, a, 2)
	mu.Lock()
	for _, args := range warmUps {
		if !slices.Equal(args, []string{warmUpProgram}) {
			t.Errorf("a warm-up started %q, want %s alone", args, warmUpProgram)
		}
	}
	mu.Unlock()
	pooled := e.poolIDs()
	for _, id := range pooled {
		if spec, _, _ := e.driver.Spec(id); spec.CPUMillis != 0 {
			t.Errorf("entry %s boots with a CPU quota of %d millicores; the binding sets the workspace's", id, spec.CPUMillis)
		}
	}

	as := e.assignment("ws_b", 1, "lay_b")
	as.Resources.CpuMillis = 250
	r := e.running(t, as)
	if r.LayerContinued || r.GetLayerCapacityBytes() != 64<<20 || r.GetNetwork().GetStatus().GetAppliedRevision() != 1 ||
		r.GetGuest().GetCondition() != ctrlv1.GuestCondition_GUEST_CONDITION_RESPONDING {
		t.Errorf("RUNNING report of the bound execution: %v", r)
	}
	// Its layers were there and it needs no booting: it goes to RUNNING
	// with no report on the way, each a call to ctrl before AVAILABLE.
	if got := e.api.states(as.ExecutionId); !slices.Equal(got, []hostv1.ObservedState{hostv1.ObservedState_OBSERVED_STATE_RUNNING}) {
		t.Errorf("the bound execution reported %v, want RUNNING alone", got)
	}
	// The first data-plane call takes the connection the entry opened.
	res, err := a.guestHTTPClient().Get("http://" + a.guestHost(as.ExecutionId) + "/kibotos.data.v1.ProcessService/ListProcesses")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	rid := a.pool.runtimeID(as.ExecutionId)
	mu.Lock()
	warmedFor := greeted[lastCall]
	mu.Unlock()
	if warmedFor != rid {
		t.Errorf("the first call to the bound guest %s went on a connection warmed for %q", rid, warmedFor)
	}
	if !slices.Contains(pooled, rid) {
		t.Fatalf("the execution is served by %q, not by an entry of %v", rid, pooled)
	}
	spec, memory, _ := e.driver.Spec(rid)
	layer := filepath.Join(e.cfg.LayerDir, "lay_b.ext4")
	if spec.LayerImage != layer || spec.Hostname != "ws_b" || spec.CPUMillis != 250 || memory != 256<<20 || spec.PidsLimit != pidsLimit {
		t.Errorf("bound with %+v, memory %d", spec, memory)
	}
	// The bound layer is held in full, as the built one is; the entries
	// waiting hold back no disk.
	if !e.driver.Reserved(layer) || !e.driver.Reserved(filepath.Join(e.cfg.LayerDir, "lay_a.ext4")) {
		t.Error("a workspace's layer is not reserved")
	}
	for _, id := range pooled {
		if spec, _, _ := e.driver.Spec(id); id != rid && e.driver.Reserved(spec.LayerImage) {
			t.Errorf("the waiting entry %s holds its layer in full", id)
		}
	}
	if s := a.execs[as.ExecutionId].getSlot(); s == nil || s.Report().GetStatus().GetAppliedRevision() != 1 {
		t.Error("the entry's slot does not carry the workspace's policy")
	}
	if _, err := os.Stat(filepath.Join(e.cfg.Network.Dir, rid)); err != nil {
		t.Errorf("the namespace of the bound execution: %v", err)
	}
	e.awaitPool(t, 3) // the bound one and two new
	raised := proto.CloneOf(as)
	raised.Resources.MemoryBytes = 512 << 20
	e.api.assign(as.ExecutionId, raised)
	eventually(t, "a raised memory reaches the bound execution", func() bool {
		_, memory, _ := e.driver.Spec(rid)
		return memory == 512<<20
	})

	mark := e.api.assign(as.ExecutionId, stopped(raised, ctrlv1.StopMode_STOP_MODE_NORMAL, "cmd_stop"))
	e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_STOPPED)
	e.released(t, rid)
	if got := a.pool.runtimeID(as.ExecutionId); got != as.ExecutionId {
		t.Errorf("a stopped execution is still served by %s", got)
	}
	if _, err := os.Stat(layer); err != nil {
		t.Errorf("the layer went with the stop: %v", err)
	}
	e.api.assign(as.ExecutionId, nil)
	next := e.assignment("ws_b", 2, "lay_b")
	if r := e.running(t, next); !r.LayerContinued {
		t.Errorf("the next start did not continue the layer: %v", r)
	}
	if _, _, ok := e.driver.Spec(next.ExecutionId); !ok {
		t.Error("a start on an existing layer was not built")
	}
}

// TestWarmPoolFillsAtOnce: entries missing from the pool start together,
// up to maxFills, rather than each waiting for the one before to be ready.
func TestWarmPoolFillsAtOnce(t *testing.T) {
	e := newReconcilerEnv(t)
	e.cfg.WarmPool = maxFills
	e.driver.HoldReady(true) // no guest answers: every start stays in flight
	e.runAgent(t, e.driver)
	first := e.assignment("ws_a", 1, "lay_a")
	e.api.assign(first.ExecutionId, first) // its shape makes the pool fill
	eventually(t, "the pool starts its entries at once", func() bool { return len(e.poolIDs()) == maxFills })
	e.driver.HoldReady(false)
	for _, id := range append(e.poolIDs(), first.ExecutionId) {
		e.driver.Answer(id)
	}
	e.running(t, first)
	e.awaitPool(t, maxFills)
}

// heldPool runs an agent whose pool of size holds refills as hold and
// rapid say (refillHold, rapidTakes), filled after a first, built start.
func (e *reconcilerEnv) heldPool(t *testing.T, size int, hold, rapid time.Duration) *Agent {
	t.Helper()
	e.cfg.WarmPool = size
	a, _ := e.runAgent(t, e.driver)
	a.pool.mu.Lock()
	a.pool.hold, a.pool.rapid = hold, rapid
	a.pool.mu.Unlock()
	e.running(t, e.assignment("ws_a", 1, "lay_a"))
	e.awaitReady(t, a, size)
	return a
}

// bind starts the fresh workspace id and checks that a pool entry serves
// it.
func (e *reconcilerEnv) bind(t *testing.T, a *Agent, id string) {
	t.Helper()
	as := e.assignment(id, 1, "lay_"+id)
	e.running(t, as)
	if a.pool.runtimeID(as.ExecutionId) == as.ExecutionId {
		t.Fatalf("%s was not bound to a pool entry", id)
	}
}

// stillHeld checks, after long enough for an unheld refill to start on
// the fake, that the driver runs n pool entries.
func (e *reconcilerEnv) stillHeld(t *testing.T, n int, what string) {
	t.Helper()
	time.Sleep(200 * time.Millisecond)
	if got := len(e.poolIDs()); got != n {
		t.Fatalf("%d pool runtime IDs after %s, want %d", got, what, n)
	}
}

// TestWarmPoolRefillHold: a take that leaves a ready entry holds the
// refill back (the bound workspace's first calls have the host to
// themselves), and a take that empties the pool refills it at once.
func TestWarmPoolRefillHold(t *testing.T) {
	e := newReconcilerEnv(t)
	a := e.heldPool(t, 2, time.Hour, 0)
	e.bind(t, a, "ws_b")
	e.stillHeld(t, 2, "a take that left a ready entry (the bound one and the ready one)")
	e.bind(t, a, "ws_c")
	e.awaitPool(t, 4) // the two bound and two new, though the hour is not over
}

// TestWarmPoolRapidTakes: a take soon after another refills at once,
// though an entry is left: creates that follow each other that fast
// drain the pool, and a hold would leave it empty for the next.
func TestWarmPoolRapidTakes(t *testing.T) {
	e := newReconcilerEnv(t)
	a := e.heldPool(t, 3, time.Hour, time.Hour)
	e.bind(t, a, "ws_b") // the first take: held
	e.stillHeld(t, 3, "the first take (the bound one and two ready)")
	e.bind(t, a, "ws_c")
	e.awaitPool(t, 5) // the two bound, the one left and two new, though the hour is not over
}

// TestWarmPoolOtherShapes: a start with a Volume, another memory or
// another layer size is built, never bound; a fresh start of a new shape
// makes the pool evict the entries of the old one.
func TestWarmPoolOtherShapes(t *testing.T) {
	e := newReconcilerEnv(t)
	e.cfg.WarmPool = 1
	a, _ := e.runAgent(t, e.driver)
	e.running(t, e.assignment("ws_a", 1, "lay_a"))
	e.awaitPool(t, 1)
	old := e.poolIDs()

	memory := e.assignment("ws_m", 1, "lay_m")
	memory.Resources.MemoryBytes = 384 << 20
	layer := e.assignment("ws_l", 1, "lay_l")
	layer.Resources.WritableLayerBytes = 128 << 20
	for _, as := range []*hostv1.Assignment{memory, layer} {
		e.running(t, as)
		if a.pool.runtimeID(as.ExecutionId) != as.ExecutionId {
			t.Errorf("%s was bound to an entry of another shape", as.ExecutionId)
		}
	}
	// Entries of the shapes before may still be starting: the pool settles
	// on one entry of the latest fresh start's shape.
	eventually(t, "the pool holds one entry of the latest fresh start's memory", func() bool {
		ids := e.poolIDs()
		if len(ids) != 1 {
			return false
		}
		spec, _, _ := e.driver.Spec(ids[0])
		return spec.MemoryBytes == 256<<20
	})
	if slices.Equal(e.poolIDs(), old) {
		t.Error("the entry of the old shape was kept")
	}
}

// TestWarmPoolRoom: the pool fills only while its entries and the
// assigned executions fit the host's memory, and evicts entries when an
// assignment needs the room.
func TestWarmPoolRoom(t *testing.T) {
	e := newReconcilerEnv(t)
	e.cfg.WarmPool = 3
	e.cfg.Capacity = &hostv1.HostCapacity{MemoryBytes: 1 << 30}
	e.runAgent(t, e.driver)
	e.running(t, e.assignment("ws_a", 1, "lay_a")) // 256 MiB
	e.awaitPool(t, 3)                              // 4 × 256 MiB fill the host
	// A start on a layer that exists is never bound, and leaves the
	// wanted shape alone.
	big := e.assignment("ws_big", 1, "lay_big")
	big.Resources.MemoryBytes = 512 << 20
	if err := e.driver.CreateLayer(t.Context(), filepath.Join(e.cfg.LayerDir, "lay_big.ext4"), 64<<20); err != nil {
		t.Fatal(err)
	}
	e.running(t, big)
	e.awaitPool(t, 1)
}

// TestWarmPoolRecovery: after the end of an agent that left its pool
// (as a killed process does), the next agent adopts the bound execution
// under its ID and releases the entries no execution was bound to: their
// runtime IDs, namespaces and layer images.
func TestWarmPoolRecovery(t *testing.T) {
	e := newReconcilerEnv(t)
	e.cfg.WarmPool = 2
	a, end := e.runAgent(t, e.driver)
	e.running(t, e.assignment("ws_a", 1, "lay_a"))
	e.awaitReady(t, a, 2)
	as := e.assignment("ws_b", 1, "lay_b")
	e.running(t, as)
	rid := a.pool.runtimeID(as.ExecutionId)
	e.awaitPool(t, 3)
	a.pool.mu.Lock()
	a.pool.ready = nil // left behind, as by a killed process
	a.pool.mu.Unlock()
	end()
	// Without the kept shape the next agent fills nothing: what is left
	// of the pool is what this one left.
	if err := os.Remove(filepath.Join(a.pool.dir, shapeFile)); err != nil {
		t.Fatal(err)
	}

	a, _ = e.runAgent(t, e.driver.Restart())
	eventually(t, "the unbound entries are released", func() bool { return slices.Equal(e.poolIDs(), []string{rid}) })
	if got := a.pool.runtimeID(as.ExecutionId); got != rid {
		t.Errorf("the adopted execution is served by %q, want %q", got, rid)
	}
	mark := e.api.mark()
	e.api.assign(as.ExecutionId, as)
	if r := e.api.await(t, mark, as.ExecutionId, hostv1.ObservedState_OBSERVED_STATE_RUNNING); r.GetNetwork().GetStatus().GetAppliedRevision() != 1 {
		t.Errorf("the adopted execution's report: %v", r)
	}
	ents, _ := os.ReadDir(e.cfg.Network.Dir)
	for _, ent := range ents {
		if ent.Name() != rid && strings.HasPrefix(ent.Name(), poolPrefix) {
			t.Errorf("the namespace of entry %s is left", ent.Name())
		}
	}
	images, err := os.ReadDir(a.pool.images)
	if err != nil || len(images) != 0 {
		t.Errorf("layer images of entries are left: %v %v", images, err)
	}
	if _, err := os.Stat(filepath.Join(a.pool.aliasDir, as.ExecutionId)); err != nil {
		t.Errorf("the alias of the adopted execution: %v", err)
	}
	e.api.assign(as.ExecutionId, nil)
	eventually(t, "the unassigned execution is released with its alias", func() bool {
		_, err := os.Stat(filepath.Join(a.pool.aliasDir, as.ExecutionId))
		return !slices.Contains(e.driver.IDs(), rid) && errors.Is(err, os.ErrNotExist)
	})
}

// TestWarmPoolShapeKeptAcrossRestart: the next agent fills the pool with
// the shape the last one wanted, at once, and binds its entries to a
// start of that shape, rather than waiting for a start it builds.
func TestWarmPoolShapeKeptAcrossRestart(t *testing.T) {
	e := newReconcilerEnv(t)
	e.cfg.WarmPool = 2
	a, end := e.runAgent(t, e.driver)
	e.running(t, e.assignment("ws_a", 1, "lay_a"))
	e.awaitReady(t, a, 2)
	end()
	e.awaitPool(t, 0) // a graceful end releases the entries

	a, _ = e.runAgent(t, e.driver.Restart())
	e.awaitReady(t, a, 2)
	as := e.assignment("ws_b", 1, "lay_b")
	e.running(t, as)
	if rid := a.pool.runtimeID(as.ExecutionId); !strings.HasPrefix(rid, poolPrefix) {
		t.Errorf("the first start after the restart was built (%s), not bound to an entry", rid)
	}
}

// warmUpGuest is a guest's ProcessService that refuses every start, as
// a guest agent refuses warmUpProgram, which does not exist.
type warmUpGuest struct {
	datav1connect.UnimplementedProcessServiceHandler
	started func(args []string)
}

func (g warmUpGuest) StartProcess(_ context.Context, req *connect.Request[datav1.StartProcessRequest], _ *connect.ServerStream[datav1.ProcessEvent]) error {
	g.started(req.Msg.GetArgs())
	return connect.NewError(connect.CodeNotFound, errors.New("no such program"))
}
