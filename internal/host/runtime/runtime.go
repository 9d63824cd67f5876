// Package runtime defines how a host runs executions: the Driver interface
// that every runtime implements (the OCI driver in oci/ today, a VM driver
// later), and the Spec of one execution. Nothing above a Driver may assume
// that an execution is a container.
package runtime

import (
	"cmp"
	"context"
	"errors"
	"net"
	"time"

	"github.com/kibotos/kibotos/internal/guestabi"
	"github.com/kibotos/kibotos/internal/host/psi"
)

// ErrNotFound is returned for an execution the driver does not know.
var ErrNotFound = errors.New("runtime: execution not found")

// ErrNoProcess is what KillLargestProcess returns when nothing but the
// guest agent runs in the guest.
var ErrNoProcess = errors.New("runtime: no process to kill but the guest agent")

// Spec is everything a driver needs to start one execution.
type Spec struct {
	// ID names the execution on this host; it is unique per host and safe
	// as a file name and a container ID ([a-z0-9_-], at most 64 bytes).
	ID string
	// Layers are host directories holding the template's unpacked layers,
	// lowest first. They are shared by every execution and never written.
	Layers []string
	// LayerImage is the host path of the writable layer: an ext4 image
	// file of exactly LayerBytes, created by CreateLayer. It outlives the
	// execution; the next start of the same workspace reuses it.
	LayerImage string
	// CPUMillis is the CPU limit in thousandths of a core (CFS quota).
	CPUMillis uint32
	// MemoryBytes is the hard memory limit, without swap.
	MemoryBytes uint64
	// PidsLimit bounds the number of tasks.
	PidsLimit int64
	// GuestAgent is the host path of the static kibotos-guest binary,
	// bind-mounted read-only into the guest and run as its PID 1.
	GuestAgent string
	// Hostname is the guest's hostname.
	Hostname string
	// Env is extra environment of the guest agent (and so of the guest's
	// processes), KEY=value.
	Env []string
	// NetNS is the host path of the network namespace the execution joins
	// (its network slot); empty gives it a fresh one with only loopback.
	NetNS string
	// ResolvConf, when set, is the guest's /etc/resolv.conf at start. The
	// guest may change its copy; nothing rewrites it while it runs.
	ResolvConf []byte
	// Volume, when set, is mounted into the guest.
	Volume *VolumeMount
	// Display, when set, has the guest agent run an X display of this
	// size (guestabi.DisplayName) before it answers the readiness probe.
	Display *guestabi.DisplaySize
}

// VolumeMount is a volume of an execution: an ext4 image that outlives
// the execution (it is the workspace's persistent data), mounted
// read-write into the guest. The driver never formats or grows it; it
// only mounts it, and an image in use by another execution is refused.
type VolumeMount struct {
	// Image is the host path of the volume's ext4 image.
	Image string
	// Path is the absolute guest path it is mounted at (e.g. /data); see
	// guestabi.CheckVolumePath.
	Path string
}

// Status is what a driver observes of an execution.
type Status struct {
	// Running is true while the execution's init process lives.
	Running bool
	// Ready is true once the guest agent answered the readiness probe.
	Ready bool
	// ExitCode and Signal describe how init ended, when not Running.
	ExitCode int
	Signal   string
	// OOMKilled reports that the memory limit killed a process of the
	// execution at least once, and OOMKills how many it killed.
	OOMKilled bool
	OOMKills  uint64
	// Shutdown reports, once init has ended, that the guest shut its
	// machine down (poweroff, halt) rather than reset it: its agent
	// recorded guestabi.EndShutdown. An init that ended any other way (a
	// reset, a kill, a crash) leaves it false.
	Shutdown bool
}

// GuestCheck is one periodic look at a running execution's guest: a probe
// of its agent and the kernel's counters of the execution.
type GuestCheck struct {
	// ProbeErr is why the guest agent did not answer; nil when it did.
	ProbeErr error
	// BootID identifies the run of the guest agent that answered; empty
	// when it did not.
	BootID string
	// OOMKills is how many processes of the execution the memory limit
	// has killed so far.
	OOMKills uint64
	// MemoryPressure is the kernel's pressure stall information of the
	// execution's memory (its cgroup's memory.pressure), read after the
	// probe; nil when the kernel does not account it for the execution.
	MemoryPressure *psi.Pressure
}

// GuestProcess is a process running in a guest.
type GuestProcess struct {
	// PID is its process ID in the guest.
	PID int32
	// Command is its name as the kernel keeps it (comm: at most 15 bytes,
	// without arguments).
	Command string
	// RSSBytes is its resident set.
	RSSBytes uint64
}

// LargestProcess returns the process a memory kill chooses among procs:
// the one with the largest resident set, never the guest agent (PID 1);
// of equal ones, the lowest PID. ok is false when there is none.
func LargestProcess(procs []GuestProcess) (p GuestProcess, ok bool) {
	for _, q := range procs {
		if q.PID == 1 {
			continue
		}
		if !ok || cmp.Or(cmp.Compare(q.RSSBytes, p.RSSBytes), cmp.Compare(p.PID, q.PID)) > 0 {
			p, ok = q, true
		}
	}
	return p, ok
}

// Metrics is what a running execution uses, as the host counts it.
type Metrics struct {
	// CPU is the CPU time its processes have used since it started.
	CPU time.Duration
	// MemoryBytes is the memory it uses now as its limit counts it (page
	// cache and tmpfs included); MemoryLimitBytes is that limit.
	MemoryBytes, MemoryLimitBytes uint64
	// MemorySomeAvg10 and MemoryFullAvg10 are its memory pressure stall
	// information: the percentage of the last 10 seconds in which some (or
	// all) of its processes waited for memory. Zero where the kernel keeps
	// none per execution.
	MemorySomeAvg10, MemoryFullAvg10 float64
	// LayerUsedBytes and LayerCapacityBytes are the bytes in use and the
	// size of the writable layer's filesystem.
	LayerUsedBytes, LayerCapacityBytes uint64
	// VolumeUsedBytes and VolumeCapacityBytes are those of the volume's
	// filesystem; zero without a volume.
	VolumeUsedBytes, VolumeCapacityBytes uint64
	// Processes counts its processes, the guest agent included.
	Processes uint32
}

// StopMode selects how Stop ends an execution.
type StopMode int

const (
	// StopNormal asks the guest agent to sync and end its processes
	// (TERM, grace, KILL), then unmounts the writable layer and the
	// volume cleanly.
	StopNormal StopMode = iota
	// StopForce kills at once.
	StopForce
)

// StopResult reports how a stop went.
type StopResult struct {
	// Confirmed is true when the writable layer (and the volume, if any)
	// was synced and unmounted cleanly (durability CONFIRMED).
	Confirmed bool
}

// Driver runs executions on one host. Every method takes a context and
// honours its cancellation. Methods are safe for concurrent use on
// different IDs. Every driver passes the suite in runtime/drivertest,
// which pins what this comment says.
type Driver interface {
	// Name is the runtime's name ("runc", "crun", "runsc").
	Name() string
	// Start prepares (mounts, cgroups, namespaces) and starts an
	// execution, and returns once its init process runs; it does not wait
	// for readiness (see Probe). It refuses an invalid spec, an ID that
	// runs, and a layer or volume image in use by another execution;
	// leftovers of an ended execution of the same ID are released first.
	// On error (a cancelled ctx included) nothing of the execution is left
	// on the host.
	Start(ctx context.Context, spec Spec) error
	// Probe asks the guest agent whether it is ready; nil means ready.
	// ErrNotFound if the driver has no such execution; an error once its
	// init has ended.
	Probe(ctx context.Context, id string) error
	// CheckGuest probes the guest agent of a running execution (giving up
	// when ctx ends) and reads its counters; ErrNotFound if the driver has
	// no such execution. A guest that does not answer is no error: it is
	// GuestCheck.ProbeErr. It is cheap enough to call every few seconds
	// for every execution of a host.
	CheckGuest(ctx context.Context, id string) (GuestCheck, error)
	// KillLargestProcess sends SIGKILL to the process of a running
	// execution's guest that LargestProcess chooses and returns it as it
	// was when killed. It never kills the guest agent: ErrNoProcess when
	// nothing else runs; ErrNotFound if the driver has no such execution;
	// errors.ErrUnsupported if the driver cannot see the guest's processes
	// (runsc, whose guest runs in gVisor's kernel).
	KillLargestProcess(ctx context.Context, id string) (GuestProcess, error)
	// Status observes an execution; ErrNotFound if the driver has none
	// (never started, or stopped).
	Status(ctx context.Context, id string) (Status, error)
	// Wait blocks until the execution's init process ends and returns its
	// status, or returns ctx's error when ctx ends first; ErrNotFound if
	// the driver has no such execution.
	Wait(ctx context.Context, id string) (Status, error)
	// Stop ends an execution and releases everything Start set up (the
	// container, mounts, loop devices, cgroup, namespaces), keeping the
	// layer and volume images: once it returns, neither is in use and the
	// driver no longer knows the execution. Stopping a stopped or unknown
	// execution succeeds, unconfirmed.
	Stop(ctx context.Context, id string, mode StopMode, grace time.Duration) (StopResult, error)
	// SetMemory changes the memory limit of a running execution at once;
	// an error for an execution the driver does not know.
	SetMemory(ctx context.Context, id string, bytes uint64) error
	// SetCPU changes the CPU limit of a running execution at once, in
	// thousandths of a core as Spec.CPUMillis (0: none); an error for an
	// execution the driver does not know.
	SetCPU(ctx context.Context, id string, millis uint32) error
	// VolumeUsage returns the bytes in use and the capacity of the
	// filesystem of a running execution's volume, as the mounted
	// filesystem counts them (its own metadata takes part of the image,
	// so capacity is below the image's size); ErrNotFound if the driver
	// has no such execution or it has no volume mounted.
	VolumeUsage(ctx context.Context, id string) (used, capacity uint64, err error)
	// Metrics reads what a running execution uses; ErrNotFound if the
	// driver has no such execution or its init has ended, another error
	// when a figure cannot be read. It is cheap enough to call every
	// second.
	Metrics(ctx context.Context, id string) (Metrics, error)
	// DialGuest connects to the unix socket the guest agent of a running
	// execution serves under the name (e.g. "data.sock", in the guest's
	// /run/kibotos); an error for an execution that does not run or a
	// name that is not a plain file name.
	DialGuest(ctx context.Context, id, name string) (net.Conn, error)
	// Recover re-adopts the executions left by an earlier process of this
	// host agent (from the runtime's state and the driver's own records),
	// releases the leftovers of any that are no longer running, and
	// returns the IDs of those still running. An execution whose guest shut
	// down (Status.Shutdown) while no process watched is kept and returned
	// too, so that its caller learns of the shutdown (from Status or Wait)
	// rather than starting it again; its Stop releases it. A new driver
	// object over the same host state serves the adopted executions like
	// its own.
	Recover(ctx context.Context) ([]string, error)
}

// Layers manages writable-layer images.
type Layers interface {
	// CreateLayer creates an ext4 image of exactly bytes at path, unless
	// one exists already.
	CreateLayer(ctx context.Context, path string, bytes uint64) error
	// GrowLayer grows the filesystem of the image at path to bytes (a
	// whole number of MiB); an image already that large is left alone. The
	// image must not be in use. A crash at any moment leaves the old image
	// or the grown one at path.
	GrowLayer(ctx context.Context, path string, bytes uint64) error
	// ReserveLayer makes the host's filesystem hold every block of the
	// image at path (see diskimage.Reserve), so that no write of its guest
	// fails for want of room on the host; callers reserve an image before
	// a workspace's guest writes to it. The error wraps ENOSPC when the
	// host's disk cannot hold it.
	ReserveLayer(path string) error
	// LayerCapacity returns the size of the image at path.
	LayerCapacity(path string) (uint64, error)
	// DeleteLayer removes the image at path; a missing one is fine.
	DeleteLayer(path string) error
}

// Binding is what an execution started ahead of time (a warm pool's
// entry, started with a placeholder identity and no workspace's limits)
// takes on when a workspace claims it.
type Binding struct {
	// LayerImage is where the execution's writable layer image moves to
	// (the workspace's own path); nothing may exist there yet.
	LayerImage string
	// Hostname replaces the placeholder hostname of the guest.
	Hostname string
	// CPUMillis, MemoryBytes and PidsLimit replace the execution's limits
	// as Spec's fields of the same names set them; the guest's /tmp and
	// /run keep the size they had at start, so a binding asks for the
	// memory the execution started with.
	CPUMillis   uint32
	MemoryBytes uint64
	PidsLimit   int64
}

// Binder is a Driver that can hand a running execution to a workspace.
type Binder interface {
	// Bind moves the layer image of the running execution id to
	// b.LayerImage and gives the execution b's hostname and limits; ID,
	// mounts and network namespace stay. ErrNotFound if the driver has
	// no such execution. After an error the execution is fit only to be
	// stopped.
	Bind(ctx context.Context, id string, b Binding) error
}
