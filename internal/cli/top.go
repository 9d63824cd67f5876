package cli

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// The escape sequences that redraw a terminal in place: clear it once,
// then per frame go home, clear the rest of each line written and the
// rest of the screen below.
const (
	clearScreen  = "\x1b[2J"
	cursorHome   = "\x1b[H"
	clearLineEnd = "\x1b[K"
	clearBelow   = "\x1b[J"
)

// topSample is one read of a Workspace's metrics with the one before it,
// from which rates are computed; prev is nil for the first.
type topSample struct {
	prev, cur *datav1.ReadMetricsResponse
}

var topTable = table[topSample]{
	header: []string{"CPU", "CPU TIME", "MEMORY", "PRESSURE", "DISK", "VOLUME", "NET RX", "NET TX", "PROCESSES"},
	row: func(s topSample) []string {
		m := s.cur
		return []string{
			cpuPercent(s.prev, m),
			cpuTime(m.GetCpuUsageSeconds()),
			usedOf(m.GetMemoryBytes(), m.GetMemoryLimitBytes()),
			fmt.Sprintf("%.2f%%/%.2f%%", m.GetMemorySomeAvg10(), m.GetMemoryFullAvg10()),
			usedOf(m.GetWritableLayerUsedBytes(), m.GetWritableLayerCapacityBytes()),
			usedOf(m.GetVolumeUsedBytes(), m.GetVolumeCapacityBytes()),
			approxSize(m.GetNetworkRxBytes()),
			approxSize(m.GetNetworkTxBytes()),
			strconv.FormatUint(uint64(m.GetProcesses()), 10),
		}
	},
}

// cpuPercent is the CPU use between two reads in percent of one core, as
// top shows it; "-" without an earlier read of the same execution.
func cpuPercent(prev, cur *datav1.ReadMetricsResponse) string {
	if prev == nil {
		return "-"
	}
	wall := cur.GetReadAt().AsTime().Sub(prev.GetReadAt().AsTime()).Seconds()
	used := cur.GetCpuUsageSeconds() - prev.GetCpuUsageSeconds()
	if wall <= 0 || used < 0 { // a new execution counts from zero
		return "-"
	}
	return strconv.FormatFloat(used/wall*100, 'f', 1, 64) + "%"
}

// cpuTime formats CPU seconds as a duration to the hundredth: 3.21s, 1m2.5s.
func cpuTime(seconds float64) string {
	return time.Duration(seconds * float64(time.Second)).Round(10 * time.Millisecond).String()
}

// usedOf formats bytes used of a capacity: 41.2Mi/128.0Mi; "-" for no
// capacity (a Workspace without a Volume).
func usedOf(used, capacity uint64) string {
	if capacity == 0 {
		return "-"
	}
	return approxSize(used) + "/" + approxSize(capacity)
}

func wsTopCommand(c *conn) *cobra.Command {
	var (
		once     bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "top ID [--once] [--interval 1s]",
		Short: "Show what a Workspace uses (CPU, memory, disk, network, processes), refreshed in place",
		Long: "Show what the Workspace's current execution uses, as the host that runs it counts it: CPU\n" +
			"(percent of one core over the last interval, and the CPU time since the start), memory used\n" +
			"of its limit (page cache and tmpfs included), memory pressure (the share of the last 10 s in\n" +
			"which some/all of its processes waited for memory), the writable layer's and the Volume's\n" +
			"filesystems (used/capacity, as df counts them), the bytes its network link received and\n" +
			"sent, and its processes. Sizes are binary: Ki, Mi, Gi.\n\n" +
			"On a terminal the table is redrawn in place every --interval until Ctrl-C. With --once, or\n" +
			"when stdout is not a terminal, it reads twice, --interval apart (for the CPU column), prints\n" +
			"one table and exits. -o json prints one read of ReadMetrics as JSON.",
		Args: cobra.ExactArgs(1),
	}
	f := cmd.Flags()
	f.BoolVar(&once, "once", false, "print one table and exit, even on a terminal")
	f.DurationVar(&interval, "interval", time.Second, "time between reads")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if interval <= 0 {
			return fmt.Errorf("--interval %s: want a positive duration such as 1s or 500ms", interval)
		}
		ws, closeIdle, err := openWorkspace(cmd, c, args[0])
		if err != nil {
			return err
		}
		defer closeIdle()
		ctx, out := cmd.Context(), cmd.OutOrStdout()
		m, err := ws.Metrics(ctx)
		if err != nil {
			return err
		}
		if c.structured() {
			return c.writeMessage(out, m)
		}
		_, tty := terminalFd(out)
		live := tty && !once
		if live {
			if _, err := io.WriteString(out, clearScreen); err != nil {
				return err
			}
		}
		tick := time.NewTicker(interval)
		defer tick.Stop()
		var prev *datav1.ReadMetricsResponse
		for {
			if live {
				if err := drawTop(out, ws.ID(), interval, topSample{prev, m}); err != nil {
					return err
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err() // interrupted: Main says so, and exits 128 plus the signal
			case <-tick.C:
			}
			next, err := ws.Metrics(ctx)
			if err != nil {
				if live && ctx.Err() != nil {
					return nil
				}
				return err
			}
			prev, m = m, next
			if !live {
				return topTable.write(out, []topSample{{prev, m}}, false)
			}
		}
	}
	return cmd
}

// drawTop redraws the terminal with a title line and the table of s.
func drawTop(w io.Writer, id string, interval time.Duration, s topSample) error {
	var frame bytes.Buffer
	fmt.Fprintf(&frame, "%s   %s   every %s, Ctrl-C quits\n\n", id,
		s.cur.GetReadAt().AsTime().Local().Format(time.TimeOnly), interval)
	if err := topTable.write(&frame, []topSample{s}, false); err != nil {
		return err
	}
	text := strings.ReplaceAll(frame.String(), "\n", clearLineEnd+"\n")
	_, err := io.WriteString(w, cursorHome+text+clearBelow)
	return err
}
