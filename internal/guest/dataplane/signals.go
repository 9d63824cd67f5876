package dataplane

import (
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// parseSignal accepts a signal name with or without the SIG prefix, in
// any case ("SIGTERM", "term", "KILL"), or a number from 1 to 64.
func parseSignal(s string) (unix.Signal, bool) {
	s = strings.ToUpper(strings.TrimSpace(s))
	// A number, or SIG and a number (as signalName names one without a
	// name).
	if n, err := strconv.Atoi(strings.TrimPrefix(s, "SIG")); err == nil {
		if n >= 1 && n <= 64 {
			return unix.Signal(n), true
		}
		return 0, false
	}
	if s == "" {
		return 0, false
	}
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	sig := unix.SignalNum(s)
	return sig, sig != 0
}

// signalName names sig as the Exited event does ("SIGKILL").
func signalName(sig unix.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return name
	}
	return "SIG" + strconv.Itoa(int(sig))
}

// exitEvent describes a wait status.
func exitEvent(ws unix.WaitStatus) *datav1.ProcessEvent_Exited {
	if ws.Signaled() {
		return &datav1.ProcessEvent_Exited{Signal: signalName(ws.Signal())}
	}
	return &datav1.ProcessEvent_Exited{ExitCode: int32(ws.ExitStatus())}
}
