package oci

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// runc's own record of a container, read in place of `runc state`: each
// run of the runc binary costs about 7 ms of CPU here, and an execution's
// start, exit watch and stop ask for its state some eight times. The
// status follows runc 1.1's (libcontainer's refreshState): init is the
// process whose PID and start time runc recorded; it has ended when that
// process is gone, another process holds the PID, or it is a zombie;
// while runc's exec FIFO exists the container is created but not started.
// The driver never pauses a container, so "paused" is not told apart.

// runcRecord is the part of runc's state.json read here.
type runcRecord struct {
	ID        string  `json:"id"`
	InitPid   int     `json:"init_process_pid"`
	InitStart *uint64 `json:"init_process_start"`
}

// errUnknownRecord is a state.json this reading does not understand; the
// driver asks runc then.
var errUnknownRecord = errors.New("oci: runc's state record has no init process")

// runcStateFromRecord returns the state of container id as `runc state`
// would, from runc's state directory root: errNoContainer when runc has
// no record of it, errUnknownRecord when the record lacks what is read.
func runcStateFromRecord(root, id string) (containerState, error) {
	rec, err := readRuncRecord(root, id)
	if err != nil {
		return containerState{}, err
	}
	if !rec.initRuns() {
		return containerState{ID: id, Status: "stopped"}, nil
	}
	status := "running"
	if _, err := os.Lstat(filepath.Join(root, id, "exec.fifo")); err == nil {
		status = "created"
	}
	return containerState{ID: id, Pid: rec.InitPid, Status: status}, nil
}

// readRuncRecord reads runc's record of container id: errNoContainer when
// there is none, errUnknownRecord when it lacks the init process.
func readRuncRecord(root, id string) (runcRecord, error) {
	b, err := os.ReadFile(filepath.Join(root, id, "state.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return runcRecord{}, fmt.Errorf("%w: %s", errNoContainer, id)
	}
	if err != nil {
		return runcRecord{}, err
	}
	rec, err := decodeRuncRecord(b)
	if err != nil || rec.ID != id || rec.InitPid <= 0 || rec.InitStart == nil {
		return runcRecord{}, errUnknownRecord
	}
	return rec, nil
}

// decodeRuncRecord decodes the fields of runcRecord from a state.json,
// stopping once it has all three. runc writes them first, ahead of the
// container's whole config (about 30 KB): decoding all of it took a
// tenth of the deployment's CPU over back-to-back creates and deletes.
func decodeRuncRecord(b []byte) (runcRecord, error) {
	var rec runcRecord
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return rec, errUnknownRecord
	}
	for seen := 0; seen < 3 && dec.More(); {
		t, err := dec.Token()
		if err != nil {
			return rec, err
		}
		var field any
		switch t {
		case "id":
			field = &rec.ID
		case "init_process_pid":
			field = &rec.InitPid
		case "init_process_start":
			field = &rec.InitStart
		default:
			field = &json.RawMessage{}
			seen--
		}
		if err := dec.Decode(field); err != nil {
			return rec, err
		}
		seen++
	}
	return rec, nil
}

// initRuns reports whether the recorded init process still runs.
func (r runcRecord) initRuns() bool { return processIs(r.InitPid, *r.InitStart) }

// signalRuncInit sends the signal named signal ("KILL", "USR2") to the
// init of runc's container id, as `runc kill` does, through a pidfd taken
// while the recorded process still held the PID. A container runc does
// not know, or whose init has ended, is not an error; errUnknownRecord
// (a record or a signal name this does not understand) sends the driver
// to runc.
func signalRuncInit(root, id, signal string) error {
	sig := unix.SignalNum("SIG" + signal)
	if sig == 0 {
		return errUnknownRecord
	}
	rec, err := readRuncRecord(root, id)
	if errors.Is(err, errNoContainer) {
		return nil
	} else if err != nil {
		return err
	}
	pidfd, err := openPidfd(rec.InitPid)
	if errors.Is(err, unix.ESRCH) {
		return nil
	} else if err != nil {
		return errUnknownRecord // no pidfd here: runc signals by PID
	}
	defer pidfd.Close()
	// Taken before this check, the pidfd is the recorded init's.
	if !rec.initRuns() {
		return nil
	}
	if err := signalPidfd(pidfd, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("oci: signalling %s: %w", id, err)
	}
	return nil
}

// processIs reports whether pid is a live process (not a zombie) that
// started at start.
func processIs(pid int, start uint64) bool {
	got, ok := processStart(pid)
	return ok && got == start
}

// processStart returns when process pid started, in clock ticks since
// boot (/proc/PID/stat's 22nd field); ok is false when there is no such
// process or it has ended (a zombie).
func processStart(pid int) (start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(b[i+1:]))
	const stateField, startField = 0, 19 // the 3rd and 22nd fields
	if len(fields) <= startField || fields[stateField] == "Z" || fields[stateField] == "X" {
		return 0, false
	}
	start, err = strconv.ParseUint(fields[startField], 10, 64)
	return start, err == nil
}
