package oci

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"strings"
	"time"
)

// Platform is the driver's platform key, oci-<runtime>/<arch>, such as
// oci-runc/amd64.
func (d *Driver) Platform() string { return "oci-" + d.name + "/" + goruntime.GOARCH }

// RuntimeVersion returns the first line the runtime prints for --version,
// such as "runc version 1.1.12".
func (d *Driver) RuntimeVersion(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, d.bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("oci: %s --version: %w", d.name, err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	if line = strings.TrimSpace(line); line == "" {
		return "", fmt.Errorf("oci: %s --version printed nothing", d.name)
	}
	return line, nil
}

// SeccompDigest is sha256:<hex> of the seccomp profile executions run
// under on this architecture, as the runtime receives it.
func SeccompDigest() string {
	b, err := json.Marshal(seccompProfile(goruntime.GOARCH))
	if err != nil {
		panic(err) // a static value of plain fields
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ProbeGvisor checks that the driver runs gVisor sandboxes: it is runsc,
// and runsc runs /bin/true in a sandbox of its own. A host offers
// runtime.gvisor only when it passes.
func (d *Driver) ProbeGvisor(ctx context.Context) error {
	if d.name != Runsc {
		return fmt.Errorf("oci: the runtime is %s, not runsc", d.name)
	}
	root, err := os.MkdirTemp(d.stateDir, "probe-")
	if err != nil {
		return fmt.Errorf("oci: %w", err)
	}
	defer os.RemoveAll(root)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, d.bin, "--root", root, "--network=none", "do", "/bin/true").CombinedOutput(); err != nil {
		return fmt.Errorf("oci: runsc do /bin/true: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
