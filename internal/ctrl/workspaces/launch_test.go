package workspaces

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
)

// testLaunch is a launch of oci-runc/amd64 whose guest build is
// sha256:<guest repeated>.
func testLaunch(guest string) *hostv1.Launch {
	return &hostv1.Launch{Platform: "oci-runc/amd64", RuntimeVersion: "runc version 1.1.12",
		GuestBuild: "sha256:" + strings.Repeat(guest, 64), SeccompProfile: "sha256:" + strings.Repeat("5", 64)}
}

// registerLaunch registers h1 again, offering launch.
func registerLaunch(t *testing.T, s *Service, ctx context.Context, launch *hostv1.Launch) {
	t.Helper()
	if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h1", Capacity: &hostv1.HostCapacity{
		CpuMillis: 4000, MemoryBytes: gib, LayerBytes: 10 * gib, DefaultLayerBytes: gib},
		Launches: []*hostv1.Launch{launch}}); err != nil {
		t.Fatal(err)
	}
}

// assignedLaunch is the launch h1's assignment of workspace id carries.
func assignedLaunch(t *testing.T, s *Service, ctx context.Context, id string) *hostv1.Launch {
	t.Helper()
	as, err := s.Assignments(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as.Assignments {
		if a.WorkspaceId == id {
			return a.Launch
		}
	}
	t.Fatalf("no assignment of %s", id)
	return nil
}

func TestLaunchBinding(t *testing.T) {
	s, ctx := newService(t)
	old, next := testLaunch("a"), testLaunch("b")
	registerLaunch(t, s, ctx, old)
	ws := create(t, s, ctx, 256<<20)
	id := ws.WorkspaceId
	if ws.Spec.LaunchRef != launchID(old) || ws.Spec.LaunchBindingVersion != 1 {
		t.Fatalf("created bound to %q version %d, want %q version 1", ws.Spec.LaunchRef, ws.Spec.LaunchBindingVersion, launchID(old))
	}
	if got := assignedLaunch(t, s, ctx, id); !proto.Equal(got, old) {
		t.Fatalf("assignment launch %v, want %v", got, old)
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)

	// A new guest build registered: the running workspace keeps its launch
	// through a guest reset and a memory update.
	registerLaunch(t, s, ctx, next)
	ws = report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, func(r *hostv1.ExecutionReport) {
		r.Guest = &ctrlv1.GuestObservation{RestartCount: 1}
	})
	ws, err := UpdateMemory(ctx, s, write("memory", newWS), id, ws.Spec.ResourcesRevision, 512<<20, identity)
	if err != nil {
		t.Fatal(err)
	}
	if ws.Spec.LaunchRef != launchID(old) || ws.Spec.LaunchBindingVersion != 1 || !proto.Equal(assignedLaunch(t, s, ctx, id), old) {
		t.Fatalf("running workspace moved to %q version %d", ws.Spec.LaunchRef, ws.Spec.LaunchBindingVersion)
	}
	// A new workspace binds to the new default.
	if other := create(t, s, ctx, 128<<20); other.Spec.LaunchRef != launchID(next) || other.Spec.LaunchBindingVersion != 1 {
		t.Errorf("new workspace bound to %q version %d, want %q", other.Spec.LaunchRef, other.Spec.LaunchBindingVersion, launchID(next))
	}

	// An explicit start rebinds to the default and counts it.
	stopAndStart := func() *ctrlv1.Workspace {
		t.Helper()
		if _, err := Stop(ctx, s, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_NORMAL, identity); err != nil {
			t.Fatal(err)
		}
		report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_STOPPED, nil)
		ws, err := Start(ctx, s, write("start", newWS), id, identity)
		if err != nil {
			t.Fatal(err)
		}
		return ws
	}
	ws = stopAndStart()
	if ws.Spec.LaunchRef != launchID(next) || ws.Spec.LaunchBindingVersion != 2 || !proto.Equal(assignedLaunch(t, s, ctx, id), next) {
		t.Fatalf("started bound to %q version %d, want %q version 2", ws.Spec.LaunchRef, ws.Spec.LaunchBindingVersion, launchID(next))
	}
	report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)

	// Rolled back: h1, the only host, offers the old launch again. It is
	// the default again, so creates keep working: an explicit start rebinds
	// to it and counts it, and a start that changes nothing does not.
	registerLaunch(t, s, ctx, old)
	if other := create(t, s, ctx, 128<<20); other.Spec.LaunchRef != launchID(old) {
		t.Errorf("after the rollback a new workspace bound to %q, want %q", other.Spec.LaunchRef, launchID(old))
	}
	for range 2 {
		if ws = stopAndStart(); ws.Spec.LaunchRef != launchID(old) || ws.Spec.LaunchBindingVersion != 3 {
			t.Fatalf("start after the rollback bound to %q version %d, want %q version 3", ws.Spec.LaunchRef, ws.Spec.LaunchBindingVersion, launchID(old))
		}
		report(t, s, ctx, id, hostv1.ObservedState_OBSERVED_STATE_RUNNING, nil)
	}
}

func TestLaunchRegistrationRefused(t *testing.T) {
	s, ctx := newService(t)
	for name, edit := range map[string]func(*hostv1.Launch){
		"platform":        func(l *hostv1.Launch) { l.Platform = "runc" },
		"runtime version": func(l *hostv1.Launch) { l.RuntimeVersion = "" },
		"guest build":     func(l *hostv1.Launch) { l.GuestBuild = "abc" },
		"seccomp":         func(l *hostv1.Launch) { l.SeccompProfile = "" },
	} {
		l := testLaunch("c")
		edit(l)
		err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: "h9", Launches: []*hostv1.Launch{l}})
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("%s: %v, want invalid_argument", name, err)
		}
	}
	if err := s.CheckRegistered(ctx, "h9"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a refused registration registered the host: %v", err)
	}
	// A host that registers no launch runs workspaces bound to none.
	ws := create(t, s, ctx, 128<<20)
	if ws.Spec.LaunchRef != "" || ws.Spec.LaunchBindingVersion != 1 || assignedLaunch(t, s, ctx, ws.WorkspaceId) != nil {
		t.Errorf("bound to %q version %d without launches", ws.Spec.LaunchRef, ws.Spec.LaunchBindingVersion)
	}
}

// TestPlacementFollowsLaunches: placement skips a host that does not run
// the launch the workspace would be bound to there. A new workspace
// avoids a host whose build is not its platform's default; one moving
// off a LOST host goes to none of another runtime, and is
// CAPABILITY_UNAVAILABLE while no host runs a launch of its platform.
func TestPlacementFollowsLaunches(t *testing.T) {
	s, ctx := newService(t)
	c := &clock{now: time.Now()}
	s.Now = c.get
	if err := s.ExpireLeases(ctx); err != nil { // the ctrl's start: leases count from here
		t.Fatal(err)
	}
	old, next := testLaunch("a"), testLaunch("b")
	runsc := &hostv1.Launch{Platform: "oci-runsc/amd64", RuntimeVersion: "runsc version 0.0~20221219.0",
		GuestBuild: next.GuestBuild, SeccompProfile: next.SeccompProfile}
	register := func(host string, memory uint64, launches ...*hostv1.Launch) {
		t.Helper()
		if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: host, Capacity: &hostv1.HostCapacity{
			CpuMillis: 4000, MemoryBytes: memory, LayerBytes: 10 * gib, DefaultLayerBytes: gib}, Launches: launches}); err != nil {
			t.Fatal(err)
		}
	}
	assigned := func(host, id string) bool {
		t.Helper()
		as, err := s.Assignments(ctx, host)
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(as.Assignments, func(a *hostv1.Assignment) bool { return a.WorkspaceId == id })
	}

	// h1 (the most memory) runs the old build only; h2 registered the new
	// one, the default: a new workspace goes to h2.
	register("h1", 4*gib, old)
	register("h2", gib, next)
	ws := create(t, s, ctx, 256<<20)
	id := ws.WorkspaceId
	if !assigned("h2", id) || ws.Spec.LaunchRef != launchID(next) {
		t.Fatalf("created bound to %q; want on h2 with %q", ws.Spec.LaunchRef, launchID(next))
	}

	// h1 and h2 are LOST; h3, of runsc, has the most memory. The
	// workspace, FORCE stopped, starts on no host: h3 runs another
	// platform.
	c.add(s.Lease())
	register("h3", 8*gib, runsc)
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	if ws, err := Stop(ctx, s, write("stop", newWS), id, ctrlv1.StopMode_STOP_MODE_FORCE, identity); err != nil ||
		ws.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Fatalf("FORCE stop on a LOST host: %v, %v", ws.GetState(), err)
	}
	_, err := Start(ctx, s, write("start", newWS), id, identity)
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "launch") {
		t.Fatalf("start with no host running its launch: %v, want failed_precondition", err)
	}
	if got, _ := s.Get(ctx, id); got.State != ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED {
		t.Fatalf("after the refused start: %v", got.State)
	}

	// h1 is back, upgraded: the workspace starts there, on its launch,
	// not on h3.
	register("h1", 4*gib, next)
	ws, err = Start(ctx, s, write("start", newWS), id, identity)
	if err != nil {
		t.Fatal(err)
	}
	if !assigned("h1", id) || assigned("h3", id) || ws.Spec.LaunchRef != launchID(next) || ws.Spec.LaunchBindingVersion != 1 {
		t.Errorf("started bound to %q version %d; want on h1 with %q version 1", ws.Spec.LaunchRef, ws.Spec.LaunchBindingVersion, launchID(next))
	}
}

// TestLaunchOfLostHostsIsNoDefault: a launch that only LOST hosts offer
// (one a host registered before it went away, say a host that made it
// up) is not its platform's default: creates and starts bind to the
// newest one a host that reports offers, and place there, rather than
// failing for want of a host that runs the default. Once a host offering
// it reports again, it is the default again.
func TestLaunchOfLostHostsIsNoDefault(t *testing.T) {
	s, ctx := newService(t)
	c := &clock{now: time.Now()}
	s.Now = c.get
	if err := s.ExpireLeases(ctx); err != nil { // the ctrl's start: leases count from here
		t.Fatal(err)
	}
	old, next := testLaunch("a"), testLaunch("b")
	register := func(host string, memory uint64, launch *hostv1.Launch) {
		t.Helper()
		if err := s.RegisterHost(ctx, &hostv1.RegisterHostRequest{HostId: host, Capacity: &hostv1.HostCapacity{
			CpuMillis: 4000, MemoryBytes: memory, LayerBytes: 10 * gib, DefaultLayerBytes: gib}, Launches: []*hostv1.Launch{launch}}); err != nil {
			t.Fatal(err)
		}
	}
	placedOn := func(ws *ctrlv1.Workspace) string {
		t.Helper()
		for _, host := range []string{"h1", "h2"} {
			as, err := s.Assignments(ctx, host)
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(as.Assignments, func(a *hostv1.Assignment) bool { return a.WorkspaceId == ws.WorkspaceId }) {
				return host
			}
		}
		return ""
	}
	register("h1", gib, old)
	register("h2", 4*gib, next) // newer: the default while h2 reports
	ws := create(t, s, ctx, 256<<20)
	if ws.Spec.LaunchRef != launchID(next) || placedOn(ws) != "h2" {
		t.Fatalf("created bound to %q on %q; want %q on h2", ws.Spec.LaunchRef, placedOn(ws), launchID(next))
	}

	// h2 is LOST.
	c.add(s.Lease())
	register("h1", gib, old)
	if err := s.ExpireLeases(ctx); err != nil {
		t.Fatal(err)
	}
	created, err := Create(ctx, s, write("create", newWS), &ctrlv1.WorkspaceCreateSpec{
		Resources: &ctrlv1.ResourceRequest{MemoryBytes: 128 << 20}}, nil, nil, identity)
	if err != nil {
		t.Fatalf("create with the default's only host LOST: %v", err)
	}
	if created.Spec.LaunchRef != launchID(old) || placedOn(created) != "h1" {
		t.Errorf("created bound to %q on %q; want %q on h1", created.Spec.LaunchRef, placedOn(created), launchID(old))
	}
	started, err := forceRestart(t, s, ctx, ws.WorkspaceId)
	if err != nil {
		t.Fatalf("start off the LOST host: %v", err)
	}
	if started.Spec.LaunchRef != launchID(old) || started.Spec.LaunchBindingVersion != 2 || placedOn(started) != "h1" {
		t.Errorf("started bound to %q version %d on %q; want %q version 2 on h1",
			started.Spec.LaunchRef, started.Spec.LaunchBindingVersion, placedOn(started), launchID(old))
	}

	// h2 reports again: its launch is the default again.
	register("h2", 4*gib, next)
	if again := create(t, s, ctx, 128<<20); again.Spec.LaunchRef != launchID(next) || placedOn(again) != "h2" {
		t.Errorf("with h2 back, created bound to %q on %q; want %q on h2", again.Spec.LaunchRef, placedOn(again), launchID(next))
	}
}
