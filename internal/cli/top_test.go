package cli

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// TestTopPrintsOneTable: off a terminal, `ws top` reads twice and prints
// one table of the Workspace's figures in human units, without escape
// sequences; -o json prints one read.
func TestTopPrintsOneTable(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, "dd if=/dev/zero of=/filler bs=1M count=3 2>/dev/null && sync")
	stdout, stderr, err := e.runData(t, "", "ws", "top", id, "--interval", "300ms")
	if err != nil {
		t.Fatalf("ws top: %v\nstderr: %s", err, stderr)
	}
	if strings.Contains(stdout, "\x1b") {
		t.Errorf("escape sequences off a terminal: %q", stdout)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) != 2 || !regexp.MustCompile(`^CPU +CPU TIME +MEMORY +PRESSURE +DISK +VOLUME +NET RX +NET TX +PROCESSES$`).MatchString(lines[0]) {
		t.Fatalf("ws top printed %q, want a header and one row", stdout)
	}
	cells := strings.Fields(lines[1])
	if len(cells) != 9 {
		t.Fatalf("row %q has %d cells, want 9", lines[1], len(cells))
	}
	for i, want := range []string{
		`^\d+\.\d%$`,                // CPU over the interval
		`^(\d+(\.\d+)?(ms|s))+$`,    // CPU time
		`^[\d.]+(Ki|Mi)?/128\.0Mi$`, // memory of its limit
		`^\d+\.\d\d%/\d+\.\d\d%$`,   // pressure
		`^[3-9]\.\dMi/[\d.]+Mi$`,    // the layer holds the filler
		`^-$`,                       // no Volume
	} {
		if !regexp.MustCompile(want).MatchString(cells[i]) {
			t.Errorf("%s = %q, want %s", strings.Fields(lines[0])[i], cells[i], want)
		}
	}
	if n, err := strconv.Atoi(cells[8]); err != nil || n < 1 {
		t.Errorf("PROCESSES = %q, want at least the guest agent", cells[8])
	}

	var m datav1.ReadMetricsResponse
	e.callJSON(t, &m, "ws", "top", id, "-o", "json")
	if m.MemoryLimitBytes != 128<<20 || m.Processes < 1 || m.WritableLayerUsedBytes < 3<<20 || m.ReadAt == nil {
		t.Errorf("ws top -o json = %v", &m)
	}
}

func TestTopRefusals(t *testing.T) {
	e, id := newDataEnv(t)
	if _, _, err := e.runData(t, "", "ws", "top", id, "--interval", "0s"); err == nil || !strings.Contains(err.Error(), "--interval") {
		t.Errorf("--interval 0s: %v", err)
	}
	if _, _, err := e.runData(t, "", "ws", "top", "ws_06h38fjb8dr6d00n3d7fkxjf2m", "--once"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("unknown workspace: %v, want not_found", err)
	}
}

func TestTopCells(t *testing.T) {
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	read := func(cpu float64, after time.Duration) *datav1.ReadMetricsResponse {
		return &datav1.ReadMetricsResponse{CpuUsageSeconds: cpu, ReadAt: timestamppb.New(at.Add(after))}
	}
	for _, c := range []struct {
		prev, cur *datav1.ReadMetricsResponse
		want      string
	}{
		{nil, read(3, 0), "-"},
		{read(1, 0), read(1.5, time.Second), "50.0%"},
		{read(1, 0), read(3, 500*time.Millisecond), "400.0%"},
		{read(5, 0), read(0.2, time.Second), "-"}, // a new execution
		{read(1, time.Second), read(1, time.Second), "-"},
	} {
		if got := cpuPercent(c.prev, c.cur); got != c.want {
			t.Errorf("cpuPercent(%v, %v) = %q, want %q", c.prev, c.cur, got, c.want)
		}
	}
	if got := cpuTime(62.345); got != "1m2.35s" {
		t.Errorf("cpuTime(62.345) = %q", got)
	}
	if got, want := usedOf(3<<20+1<<19, 64<<20), "3.5Mi/64.0Mi"; got != want {
		t.Errorf("usedOf = %q, want %q", got, want)
	}
	if got := usedOf(0, 0); got != "-" {
		t.Errorf("usedOf without a capacity = %q, want -", got)
	}
}
