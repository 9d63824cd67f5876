package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kibotos/kibotos/internal/testutil"
)

// build builds kibotos, kibotos-server and kibotos-guest into one
// directory, the first two linked with ldflags, and returns the path of
// kibotos: its server verbs run the kibotos-server beside it.
func build(t *testing.T, ldflags ...string) string {
	t.Helper()
	dir := t.TempDir()
	for name, pkg := range map[string]string{"kibotos": "github.com/kibotos/kibotos/cmd/kibotos", "kibotos-server": "github.com/kibotos/kibotos/cmd/kibotos-server"} {
		cmd := exec.Command("go", append(append([]string{"build", "-o", filepath.Join(dir, name)}, ldflags...), pkg)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	if err := testutil.Build(filepath.Join(dir, "kibotos-guest"), testutil.GuestAgentPackage); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "kibotos")
}

// adminToken reads the admin token `kibotos up` stored under home.
func adminToken(t *testing.T, home string) string {
	t.Helper()
	token, err := os.ReadFile(filepath.Join(home, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(token))
}

var readyAddr = regexp.MustCompile(`msg=ready addr=(\S+)`)

// upProcess is one `kibotos up` (or `ctrl`, or `host`) a test runs.
type upProcess struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string
	// stdout and log are files, not buffers: the child writes them
	// directly, so they are complete up to the moment it logs readiness.
	stdout, log string
}

// startUp runs `kibotos up` on home, with flags added, and waits until it
// is ready. The test's cleanup stops it if the test has not.
func startUp(t *testing.T, bin, home string, flags ...string) *upProcess {
	t.Helper()
	// No desktop template: building or importing it is not what these
	// tests are about.
	return startProcess(t, bin, append([]string{"up", "--home", home, "--listen", "127.0.0.1:0", "--desktop-cache="}, flags...)...)
}

// startProcess runs kibotos with args and waits until it logs that it is
// ready. The test's cleanup stops it if the test has not.
func startProcess(t *testing.T, bin string, args ...string) *upProcess {
	t.Helper()
	dir := t.TempDir()
	p := &upProcess{t: t, cmd: exec.Command(bin, args...),
		stdout: filepath.Join(dir, "stdout"), log: filepath.Join(dir, "log")}
	stdout, err := os.Create(p.stdout)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	log, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	p.cmd.Stdout, p.cmd.Stderr = stdout, log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("kibotos log:\n%s", b)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(p.log)
		if m := readyAddr.FindSubmatch(b); m != nil {
			p.addr = string(m[1])
			return p
		}
		if p.cmd.ProcessState != nil {
			break
		}
	}
	b, _ := os.ReadFile(p.log)
	t.Fatalf("kibotos %s did not become ready:\n%s", args[0], b)
	return nil
}

// printed returns what the process wrote on stdout.
func (p *upProcess) printed() string {
	b, _ := os.ReadFile(p.stdout)
	return string(b)
}

// stop sends SIGTERM and returns the exit code; a process that does not
// stop within 15 s is killed and the test fails.
func (p *upProcess) stop() int {
	if p.cmd.ProcessState != nil {
		return p.cmd.ProcessState.ExitCode()
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		return 0
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-done
		p.t.Error("kibotos did not stop within 15 s of SIGTERM")
		return -1
	}
}

// kill ends the process with SIGKILL, as a crash would.
func (p *upProcess) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()
}
