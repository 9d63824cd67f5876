// Package benchutil holds what the benchmark programs share: the flags that
// find the deployment, percentile reports and the bare-runc baseline they
// compare against.
package benchutil

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DeploymentFlags registers -addr and -home, where a benchmark finds the
// `kibotos up` it measures.
func DeploymentFlags() (addr, home *string) {
	return flag.String("addr", "127.0.0.1:8870", "address of kibotos up"),
		flag.String("home", "/var/lib/kibotos", "its home directory (admin token, template layers)")
}

// Main parses the flags and runs a benchmark; when run fails it prints the
// error after the benchmark's name and exits 1.
func Main(name string, run func() error) {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// AdminToken reads the admin token of the deployment whose home is home.
func AdminToken(home string) (string, error) {
	token, err := os.ReadFile(filepath.Join(home, "admin-token"))
	return strings.TrimSpace(string(token)), err
}

// Report prints the p50 and p99 of durations.
func Report(name string, d []time.Duration) {
	fmt.Printf("%-28s n=%d p50=%v p99=%v\n", name, len(d), Quantile(d, 0.50).Round(time.Millisecond), Quantile(d, 0.99).Round(time.Millisecond))
}

// Quantile returns the p-th quantile (0 to 1) of d, which it leaves as it is.
func Quantile(d []time.Duration, p float64) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// Millis returns d in milliseconds.
func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BaseRootfs finds the unpacked layer of the built-in template (one
// layer, holding bin/busybox).
func BaseRootfs(home string) (string, error) {
	dirs, _ := filepath.Glob(filepath.Join(home, "templates", "layers", "sha256", "*", "bin", "busybox"))
	if len(dirs) == 0 {
		return "", fmt.Errorf("no unpacked base layer under %s", home)
	}
	return filepath.Dir(filepath.Dir(dirs[0])), nil
}

// BareRunc times n one-shot `runc run` of args on rootfs (read-only).
func BareRunc(rootfs string, n int, args ...string) ([]time.Duration, error) {
	b, err := NewBareBundle(rootfs, args...)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	var out []time.Duration
	for range n {
		d, err := b.Run()
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// BareBundle is an OCI bundle of args on a read-only rootfs, for timing
// one-shot `runc run`s of it beside what is compared with them.
type BareBundle struct {
	dir  string
	runs int
}

// NewBareBundle writes the bundle; Close removes it.
func NewBareBundle(rootfs string, args ...string) (*BareBundle, error) {
	dir, err := os.MkdirTemp("", "wsbench-runc")
	if err != nil {
		return nil, err
	}
	b := &BareBundle{dir: dir}
	if err := b.write(rootfs, args); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *BareBundle) write(rootfs string, args []string) error {
	if out, err := exec.Command("runc", "spec", "--bundle", b.dir).CombinedOutput(); err != nil {
		return fmt.Errorf("runc spec: %v %s", err, out)
	}
	path := filepath.Join(b.dir, "config.json")
	var spec map[string]any
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	spec["root"] = map[string]any{"path": rootfs, "readonly": true}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = args
	if raw, err = json.Marshal(spec); err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o644)
}

// Run times one `runc run` of the bundle, to the container's exit.
func (b *BareBundle) Run() (time.Duration, error) {
	b.runs++
	start := time.Now()
	cmd := exec.Command("runc", "--root", filepath.Join(b.dir, "state"), "run", "--bundle", b.dir, fmt.Sprintf("wsbench-%d", b.runs))
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("runc run: %v %s", err, out)
	}
	return time.Since(start), nil
}

// Close removes the bundle.
func (b *BareBundle) Close() error { return os.RemoveAll(b.dir) }

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times.
const clockTicks = 100

// ProcessCPU reads the user and system time of a process (all threads).
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// After the command: state is field 3, utime 14 and stime 15.
	utime, err1 := strconv.ParseUint(fields[11], 10, 64)
	stime, err2 := strconv.ParseUint(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, nil
}

// MachineBusy reads the time the machine's CPUs spent busy so far (user,
// nice, system, irq and softirq in /proc/stat: not idle, iowait or the time
// the hypervisor stole), whatever ran: kernel threads too, such as a loop
// device's writer.
func MachineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(fields) < 8 || fields[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var ticks uint64
	for _, i := range []int{1, 2, 3, 6, 7} {
		n, err := strconv.ParseUint(fields[i], 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
