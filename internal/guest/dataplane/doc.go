// Package dataplane is the data plane inside a guest: the Connect handlers of
// kibotos.data.v1's ProcessService, FileService, ServiceService, and
// ScreenService and InputService (display.go, over the display of package
// internal/guest/x11) that the guest agent (cmd/kibotos-guest) serves on
// /run/kibotos/data.sock, behind the host's gateway.
//
// # Processes and the reaper
//
// The agent is PID 1 and must wait for every child (wait4(-1)) to reap
// orphans; a second waiter, such as os/exec's Cmd.Wait, would race it for
// the exit status of a process this package started. So this package
// never waits itself. It starts children with syscall.ForkExec through a
// Waiter, which owns waiting: in the agent that is pid1.Reaper (the
// pid is registered under the reaper's lock before any wait4(-1) can
// collect it, and the reaper hands the status back); ChildWaiter, for
// tests and an agent that is not PID 1, waits for each child's own pid.
// A process is reported exited only when both its status has arrived and
// its output pipes reached EOF (or, when a background child holds them
// open, after a short drain delay), so no output follows the exit event.
//
// The processes run at oom_score_adj 0 whatever the agent's own: while
// the agent's is not 0 (the runtime protects it from the OOM killer), a
// child execs a shim (a native program on amd64, else the agent's binary)
// that resets the score and then execs the program (package
// internal/guest/execshim).
//
// Every process runs in its own process group (its own session with a
// PTY), so SignalProcess signals the whole group. Its output goes to a
// bounded buffer (output.go) that streams follow; a process outlives the
// streams that watch it, and ConnectProcess replays the buffer.
//
// # Files as a user
//
// File operations run in the agent, as root, but with the filesystem
// credentials of the chosen user: the goroutine locks its OS thread and
// sets that thread's fsuid, fsgid and supplementary groups (setfsuid,
// setfsgid, setgroups are per-thread system calls on Linux) for the
// duration of the operation, then restores them (fscred_linux.go). The
// kernel thus checks permissions exactly as for the user, and files the
// operation creates belong to the user.
//
// # Errors
//
// Errors are Connect errors carrying a kibotos.ctrl.v1.ErrorDetail with
// the failure's stage; errno values map to codes as the proto says
// (errors.go).
package dataplane
