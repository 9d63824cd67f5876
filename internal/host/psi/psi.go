// Package psi reads the kernel's pressure stall information (PSI: the
// cpu.pressure, memory.pressure and io.pressure files of a cgroup2
// cgroup, and /proc/pressure/*) and judges from it whether a cgroup's
// memory is saturated. It does no I/O but ReadFile.
package psi

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Line is one line of a PSI file: how long tasks were stalled.
type Line struct {
	// Avg10, Avg60 and Avg300 are the percentages of the last 10, 60 and
	// 300 seconds during which tasks were stalled, as the kernel averages
	// them.
	Avg10, Avg60, Avg300 float64
	// Total is the time tasks were stalled since the cgroup was created
	// (the kernel counts it in microseconds). It only grows, so the
	// difference of two readings is the stall between them.
	Total time.Duration
}

// Pressure is the content of a PSI file.
type Pressure struct {
	// Some is the time at least one task was stalled.
	Some Line
	// Full is the time every task that was not idle was stalled at once.
	// A file without a full line (cpu.pressure before Linux 5.13) leaves
	// it zero.
	Full Line
}

// Parse parses the content of a PSI file:
//
//	some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//	full avg10=0.00 avg60=0.00 avg300=0.00 total=0
//
// A some line is required; unknown fields are ignored.
func Parse(data []byte) (Pressure, error) {
	var p Pressure
	var some bool
	for _, text := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		kind, fields, _ := strings.Cut(text, " ")
		var l *Line
		switch kind {
		case "some":
			l, some = &p.Some, true
		case "full":
			l = &p.Full
		default:
			return Pressure{}, fmt.Errorf("psi: unknown line %q", text)
		}
		if err := parseLine(l, fields); err != nil {
			return Pressure{}, fmt.Errorf("psi: %q: %w", text, err)
		}
	}
	if !some {
		return Pressure{}, errors.New("psi: no some line")
	}
	return p, nil
}

// parseLine parses the key=value fields of one line.
func parseLine(l *Line, fields string) error {
	var total bool
	for _, f := range strings.Fields(fields) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("field %q is not key=value", f)
		}
		var err error
		switch k {
		case "avg10":
			l.Avg10, err = strconv.ParseFloat(v, 64)
		case "avg60":
			l.Avg60, err = strconv.ParseFloat(v, 64)
		case "avg300":
			l.Avg300, err = strconv.ParseFloat(v, 64)
		case "total":
			var us uint64
			us, err = strconv.ParseUint(v, 10, 64)
			l.Total, total = time.Duration(us)*time.Microsecond, true
		}
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	if !total {
		return errors.New("no total")
	}
	return nil
}
