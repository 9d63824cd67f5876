package agent

import (
	"fmt"
	"testing"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
)

// TestExecutionsByWorkspace: the data plane finds each generation of a
// workspace by its workspace, and a forgotten execution leaves nothing
// filed.
func TestExecutionsByWorkspace(t *testing.T) {
	a := &Agent{execs: map[string]*execution{}}
	var gens []*execution
	for gen := range uint64(2) {
		as := &hostv1.Assignment{ExecutionId: fmt.Sprintf("ws_a-%d", gen+1), WorkspaceId: "ws_a", Generation: gen + 1,
			Desired: hostv1.DesiredState_DESIRED_STATE_RUNNING}
		e := &execution{agent: a, id: as.ExecutionId, wake: make(chan struct{}, 1)}
		a.execs[e.id] = e
		a.assign(e, as)
		a.assign(e, as) // a second assignment files it no second time
		gens = append(gens, e)
	}
	for gen, want := range map[uint64]string{1: "ws_a-1", 2: "ws_a-2", 3: ""} {
		if id, _, _ := a.dataPlaneTarget("ws_a", gen); id != want {
			t.Errorf("generation %d: found %q, want %q", gen, id, want)
		}
	}
	if id, _, _ := a.dataPlaneTarget("ws_b", 1); id != "" {
		t.Errorf("another workspace found %q", id)
	}
	for i, e := range gens {
		e.set(nil)
		if !a.forgetIfUnassigned(e) {
			t.Fatalf("%s was not forgotten", e.id)
		}
		if id, _, _ := a.dataPlaneTarget("ws_a", uint64(i+1)); id != "" {
			t.Errorf("the forgotten %s is still found", id)
		}
	}
	if len(a.byWorkspace) != 0 {
		t.Errorf("left filed: %v", a.byWorkspace)
	}
}

// BenchmarkDataPlaneTarget finds the execution a data-plane call goes to
// on a host of a thousand executions, as the gateway does at every call.
func BenchmarkDataPlaneTarget(b *testing.B) {
	a := &Agent{execs: map[string]*execution{}}
	for i := range 1000 {
		as := &hostv1.Assignment{ExecutionId: fmt.Sprintf("ws_%d-1", i), WorkspaceId: fmt.Sprintf("ws_%d", i), Generation: 1,
			Desired: hostv1.DesiredState_DESIRED_STATE_RUNNING}
		e := &execution{agent: a, id: as.ExecutionId, wake: make(chan struct{}, 1)}
		a.execs[e.id] = e
		a.assign(e, as)
	}
	for b.Loop() {
		if id, _, _ := a.dataPlaneTarget("ws_500", 1); id != "ws_500-1" {
			b.Fatalf("found %q", id)
		}
	}
}
