// Package oci runs executions as OCI containers with runc (default), crun
// or runsc. The rootfs of an execution is an overlay of the template's
// read-only layers and a loop-mounted ext4 image (the writable layer); the
// guest agent, kibotos-guest, is bind-mounted in and runs as PID 1. A
// volume, when the execution has one, is another loop-mounted ext4 image,
// bind-mounted at its guest path.
//
// Everything the driver sets up for an execution lives under
// StateDir/exec/<id>/ (the bundle, the mount points, the agent's socket
// directory and record.json), and the runtime keeps its own state under
// StateDir/runc. Every step is repeatable and every release finds what to
// undo from the host itself (mountinfo, loop devices, cgroups, the
// runtime's list), so a crash of the host agent at any point leaves
// nothing that Stop or Recover cannot release.
//
// Exit codes: containers run detached (they must outlive the host agent),
// so their init is not the driver's child and its exit status is not
// observable; Status and Wait report ExitCode -1 once init has ended.
package oci

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/host/diskimage"
	"github.com/kibotos/kibotos/internal/host/runtime"
)

// Runtime names.
const (
	Runc  = "runc"
	Crun  = "crun"
	Runsc = "runsc"
)

// Config configures a Driver.
type Config struct {
	// StateDir holds the driver's per-host state: bundles, mount points,
	// records and the runtime's root (e.g. HOME/runtime).
	StateDir string
	// Runtime is "runc" (default), "crun" or "runsc".
	Runtime string
	// RuntimePath is the runtime's binary; empty looks Runtime up in PATH
	// (and /usr/sbin, /usr/local/sbin).
	RuntimePath string
	// GuestTmpfsPercent sizes the guest's /tmp, /run and /dev/shm, each,
	// in percent of the execution's memory limit (1 to 100); 0 means
	// DefaultGuestTmpfsPercent.
	GuestTmpfsPercent int
}

// DefaultGuestTmpfsPercent is the default of Config.GuestTmpfsPercent.
const DefaultGuestTmpfsPercent = 25

// Driver implements runtime.Driver and runtime.Layers with an OCI runtime.
type Driver struct {
	name     string
	bin      string
	stateDir string
	execDir  string // StateDir/exec: one directory per execution
	rootDir  string // StateDir/runc: the runtime's --root
	tmpfsPct uint64 // Config.GuestTmpfsPercent
	oomAdj   int    // the guest agents' oom_score_adj

	mu    sync.Mutex
	locks map[string]*idLock

	probesMu sync.Mutex
	probes   map[string]*guestProbe // by execution ID (health.go)
}

type idLock struct {
	mu   sync.Mutex
	refs int
}

var (
	_ runtime.Driver = (*Driver)(nil)
	_ runtime.Layers = (*Driver)(nil)
)

// New returns a Driver over cfg.StateDir, creating it if needed.
func New(cfg Config) (*Driver, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("oci: StateDir is required")
	}
	name := cfg.Runtime
	if name == "" {
		name = Runc
	}
	switch name {
	case Runc, Crun, Runsc:
	default:
		return nil, fmt.Errorf("oci: unknown runtime %q (want runc, crun or runsc)", name)
	}
	tmpfsPct := cfg.GuestTmpfsPercent
	if tmpfsPct == 0 {
		tmpfsPct = DefaultGuestTmpfsPercent
	}
	if tmpfsPct < 1 || tmpfsPct > 100 {
		return nil, fmt.Errorf("oci: guest tmpfs share %d%% is not within 1 to 100", tmpfsPct)
	}
	bin := cfg.RuntimePath
	if bin == "" {
		var err error
		if bin, err = diskimage.LookPath(name); err != nil {
			return nil, fmt.Errorf("oci: runtime %s: %w", name, err)
		}
	}
	for _, sub := range []string{"exec", name} {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("oci: %w", err)
		}
	}
	// Mount points are compared with /proc/self/mountinfo, which shows
	// absolute, resolved paths.
	state, err := filepath.Abs(cfg.StateDir)
	if err == nil {
		state, err = filepath.EvalSymlinks(state)
	}
	if err != nil {
		return nil, fmt.Errorf("oci: %w", err)
	}
	oomAdj := agentOOMScoreAdj()
	if oomAdj >= 0 {
		slog.Warn("guest agents are not protected from the OOM killer: this process may not lower oom_score_adj (it lacks CAP_SYS_RESOURCE), so a guest whose processes fill its memory can lose its agent, and the workspace stops",
			"oom_score_adj", oomAdj)
	}
	if err := limitHostTasks(); err != nil {
		slog.Warn("the guests together may take every task ID of the host: the tasks of all workspaces could not be bounded",
			"cgroup", executionsCgroup, "err", err)
	}
	return &Driver{
		name:     name,
		bin:      bin,
		stateDir: state,
		execDir:  filepath.Join(state, "exec"),
		rootDir:  filepath.Join(state, name),
		tmpfsPct: uint64(tmpfsPct),
		oomAdj:   oomAdj,
		locks:    map[string]*idLock{},
		probes:   map[string]*guestProbe{},
	}, nil
}

// Name returns the runtime's name.
func (d *Driver) Name() string { return d.name }

// Detect returns the runtimes of runc, crun and runsc that are installed
// and answer --version, in that order. It does not prove that a runtime
// can run containers on this host (crun refuses a hybrid cgroup layout).
func Detect() []string {
	var found []string
	for _, name := range []string{Runc, Crun, Runsc} {
		bin, err := diskimage.LookPath(name)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = exec.CommandContext(ctx, bin, "--version").Run()
		cancel()
		if err == nil {
			found = append(found, name)
		}
	}
	return found
}

// lock serializes the operations that change one execution.
func (d *Driver) lock(id string) func() {
	d.mu.Lock()
	l := d.locks[id]
	if l == nil {
		l = &idLock{}
		d.locks[id] = l
	}
	l.refs++
	d.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		d.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(d.locks, id)
		}
		d.mu.Unlock()
	}
}

// tmpfsBytes is the size of each of a guest's /tmp, /run and /dev/shm
// for a memory limit of memory bytes (0: no limit, no size).
func (d *Driver) tmpfsBytes(memory uint64) uint64 {
	return memory/100*d.tmpfsPct + memory%100*d.tmpfsPct/100
}

// dir returns StateDir/exec/<id>.
func (d *Driver) dir(id string) string { return filepath.Join(d.execDir, id) }

// validID reports whether id is safe as a file name and container ID.
func validID(id string) bool {
	if id == "" || len(id) > 64 || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func checkID(id string) error {
	if !validID(id) {
		return fmt.Errorf("oci: invalid execution id %q", id)
	}
	return nil
}
