package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// errNoContainer is what the runtime's commands fail with for an unknown
// container.
var errNoContainer = errors.New("oci: no such container")

// containerState is the part of `runc state` the driver reads.
type containerState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"` // creating, created, running, paused, stopped
}

// alive reports whether the container's init may still run.
func (s containerState) alive() bool {
	switch s.Status {
	case "created", "creating", "running", "paused":
		return true
	}
	return false
}

// runscFlags are the global flags of every runsc command. The guest
// agent's socket is made inside the sandbox, in a directory bound from the
// host, where the host agent connects to it: --host-uds=all makes it a
// host socket (with create alone, runsc 0.0~20221219 binds it but the
// host agent's dial times out). The sandbox joins the execution's own network namespace
// and uses the host kernel's stack there (--network=host), as runc's
// processes do: runsc's default, its own network stack built from the
// namespace's interfaces, refuses every namespace on kernels that give each
// namespace its own net.core.rmem_default (6.18 does), which runsc
// 0.0~20221219 (Debian's) takes for the mark of the root namespace.
var runscFlags = []string{"--host-uds=all", "--network=host"}

// runtimeCmd builds a command of the runtime with the driver's root.
func (d *Driver) runtimeCmd(ctx context.Context, args ...string) *exec.Cmd {
	global := []string{"--root", d.rootDir}
	if d.name == Runsc {
		global = append(global, runscFlags...)
	}
	cmd := exec.CommandContext(ctx, d.bin, append(global, args...)...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// runtime runs a runtime command and returns its standard output; its
// error includes the runtime's standard error.
func (d *Driver) runtime(ctx context.Context, args ...string) ([]byte, error) {
	cmd := d.runtimeCmd(ctx, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "does not exist") || strings.Contains(msg, "not found") ||
			strings.Contains(msg, "No such file") {
			return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", d.name, args[0], errNoContainer, msg)
		}
		if ctx.Err() != nil {
			return stdout.Bytes(), ctx.Err()
		}
		return stdout.Bytes(), fmt.Errorf("%s %s: %v: %s", d.name, args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// state returns the runtime's state of id, errNoContainer if it has none.
// runc's is read from its record (runcStateFromRecord); other runtimes
// are asked.
func (d *Driver) state(ctx context.Context, id string) (containerState, error) {
	if d.name == Runc {
		if err := ctx.Err(); err != nil {
			return containerState{}, err
		}
		if st, err := runcStateFromRecord(d.rootDir, id); !errors.Is(err, errUnknownRecord) {
			return st, err
		}
	}
	return d.cliState(ctx, id)
}

// cliState returns the state of id that the runtime's state command
// prints.
func (d *Driver) cliState(ctx context.Context, id string) (containerState, error) {
	out, err := d.runtime(ctx, "state", id)
	if err != nil {
		return containerState{}, err
	}
	var st containerState
	if err := json.Unmarshal(out, &st); err != nil {
		return containerState{}, fmt.Errorf("%s state %s: %w", d.name, id, err)
	}
	return st, nil
}

// list returns the IDs of the runtime's containers.
func (d *Driver) list(ctx context.Context) ([]string, error) {
	out, err := d.runtime(ctx, "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var cs []containerState
	if s := bytes.TrimSpace(out); len(s) > 0 && !bytes.Equal(s, []byte("null")) {
		if err := json.Unmarshal(s, &cs); err != nil {
			return nil, fmt.Errorf("%s list: %w", d.name, err)
		}
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// runDetached creates and starts the container of bundle. The container's
// standard output and error (the guest agent's log) go to logPath.
func (d *Driver) runDetached(ctx context.Context, id, bundle, logPath string) error {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	start, _ := logf.Seek(0, 2)
	cmd := d.runtimeCmd(ctx, "run", "--detach", "--bundle", bundle, id)
	// Pass the file itself: the container keeps these descriptors, so a
	// pipe would never reach EOF.
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s run: %v: %s", d.name, err, tailFile(logPath, start, 2048))
	}
	return nil
}

// kill signals the container's init; a stopped or unknown container is
// not an error. runc's init is signalled directly (signalRuncInit).
func (d *Driver) kill(ctx context.Context, id, signal string) error {
	if d.name == Runc {
		if err := signalRuncInit(d.rootDir, id, signal); !errors.Is(err, errUnknownRecord) {
			return err
		}
	}
	_, err := d.runtime(ctx, "kill", id, signal)
	if err != nil && (errors.Is(err, errNoContainer) || strings.Contains(err.Error(), "not running") ||
		strings.Contains(err.Error(), "process already finished")) {
		return nil
	}
	return err
}

// deleteContainer removes the container, killing it if it runs; an
// unknown container is not an error. runc's record of a container whose
// init has ended is removed here: runc's delete would remove only that
// and the cgroups, which release removes; nothing of the container can
// outlive its init, the first process of its own PID namespace.
func (d *Driver) deleteContainer(ctx context.Context, id string) error {
	if d.name == Runc {
		if rec, err := readRuncRecord(d.rootDir, id); err == nil && !rec.initRuns() {
			return os.RemoveAll(filepath.Join(d.rootDir, id))
		}
	}
	_, err := d.runtime(ctx, "delete", "--force", id)
	if errors.Is(err, errNoContainer) {
		return nil
	}
	return err
}

// tailFile returns up to n bytes of path from offset from, trimmed.
func tailFile(path string, from int64, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	if fi.Size()-from > n {
		from = fi.Size() - n
	}
	b := make([]byte, fi.Size()-from)
	nr, _ := f.ReadAt(b, from)
	return strings.TrimSpace(string(b[:nr]))
}

// SetMemory changes a running container's memory limit, swap included so
// that it stays without swap; see runtime.Driver. runsc has no update
// command: its sandbox's cgroup is written directly (the limit binds the
// whole sandbox; the guest's MemTotal stays what it was at start).
func (d *Driver) SetMemory(ctx context.Context, id string, bytes uint64) error {
	if err := checkID(id); err != nil {
		return err
	}
	defer d.lock(id)()
	if d.name == Runsc {
		if _, err := d.state(ctx, id); err != nil {
			return d.public(err, id, nil)
		}
		return d.public(setCgroupMemory(id, bytes), id, map[string]string{cgroupRoot: "<cgroups>"})
	}
	n := strconv.FormatUint(bytes, 10)
	_, err := d.runtime(ctx, "update", "--memory", n, "--memory-swap", n, id)
	return d.public(err, id, nil)
}

// SetCPU changes a running container's CFS quota; see runtime.Driver. It
// writes the execution's cgroup directly, as Bind does, rather than run
// the runtime's update command (about 7 ms of CPU for runc).
func (d *Driver) SetCPU(ctx context.Context, id string, millis uint32) error {
	if err := checkID(id); err != nil {
		return err
	}
	defer d.lock(id)()
	st, err := d.state(ctx, id)
	if err == nil && !st.alive() {
		err = fmt.Errorf("oci: execution %s does not run", id)
	}
	if err != nil {
		return d.public(err, id, nil)
	}
	return d.public(setCgroupCPU(id, millis), id, map[string]string{cgroupRoot: "<cgroups>"})
}
