package testutil

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Build builds a package of this module (an import path such as
// github.com/kibotos/kibotos/cmd/kibotos-guest) as a static binary at out.
func Build(out, pkg string) error {
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// GuestAgentPackage is the import path of the guest agent.
const GuestAgentPackage = "github.com/kibotos/kibotos/cmd/kibotos-guest"

// RunWithGuestAgent is a TestMain: it builds the guest agent into a
// temporary directory, sets *agent to its path, runs the tests, removes
// the directory and exits with the tests' code.
func RunWithGuestAgent(m *testing.M, agent *string) {
	dir, err := os.MkdirTemp("", "kibotos-guest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*agent = filepath.Join(dir, "kibotos-guest")
	if err := Build(*agent, GuestAgentPackage); err != nil {
		os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The in-process deployments log every call at INFO; in a test's
	// output those lines bury the failure that matters.
	slog.SetLogLoggerLevel(slog.LevelWarn)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
