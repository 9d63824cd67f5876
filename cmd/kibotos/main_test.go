package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/testutil"
)

// TestUpBootstrapsServesAndStopsOnSIGTERM runs the real binary: the first
// start prints and stores an admin token, the CLI finds it, SIGTERM stops
// the process cleanly, and a second start keeps the same deployment.
func TestUpBootstrapsServesAndStopsOnSIGTERM(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kibotos up runs workspaces and needs root (make test runs as root)")
	}
	bin := build(t)
	home := filepath.Join(t.TempDir(), "home")

	stdout, addr, stop := start(t, bin, home)
	token, err := os.ReadFile(filepath.Join(home, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(home, "admin-token")); fi.Mode().Perm() != 0o600 {
		t.Errorf("admin-token mode %v, want 0600", fi.Mode().Perm())
	}
	secret := strings.TrimSpace(string(token))
	if !strings.Contains(stdout, secret) {
		t.Errorf("first start did not print the admin token; stdout:\n%s", stdout)
	}

	// The CLI finds the token under --home.
	cli := exec.Command(bin, "egress", "create", "--addr", addr, "--home", home, "--address", "93.184.216.34:1080", "-o", "json")
	cli.Env = append(os.Environ(), "KIBOTOS_TOKEN=", "KIBOTOS_ADDR=")
	out, err := cli.CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"egressId"`) {
		t.Fatalf("kibotos egress create: %v\n%s", err, out)
	}
	if code := stop(); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}

	stdout, addr, stop = start(t, bin, home)
	defer stop()
	if strings.Contains(stdout, "Admin token") {
		t.Errorf("second start printed a new admin token:\n%s", stdout)
	}
	client := ctrlv1connect.NewEgressServiceClient(http.DefaultClient, "http://"+addr)
	req := connect.NewRequest(&ctrlv1.ListEgressesRequest{})
	req.Header().Set("Authorization", "Bearer "+secret)
	list, err := client.ListEgresses(context.Background(), req)
	if err != nil || len(list.Msg.Egresses) != 1 {
		t.Errorf("after restart: %v, %v; want the one egress, with the first token", list, err)
	}
}

// build builds kibotos and, next to it, kibotos-guest, and returns the
// path of kibotos.
func build(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, pkg := range map[string]string{"kibotos": "github.com/kibotos/kibotos/cmd/kibotos", "kibotos-guest": testutil.GuestAgentPackage} {
		if err := testutil.Build(filepath.Join(dir, name), pkg); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "kibotos")
}

var servingAddr = regexp.MustCompile(`msg=ready addr=(\S+)`)

// start runs `kibotos up` and returns what it printed on stdout until it
// served, its address, and a stop function that sends SIGTERM and returns
// the exit code.
func start(t *testing.T, bin, home string) (string, string, func() int) {
	t.Helper()
	cmd := exec.Command(bin, "up", "--home", home, "--listen", "127.0.0.1:0")
	// A file, not a buffer: the child writes it directly, so it is complete
	// up to the moment the child logs that it serves.
	stdout, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	cmd.Stdout = stdout
	printed := func() string {
		b, _ := os.ReadFile(stdout.Name())
		return string(b)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	stop := func() int {
		if exited {
			return cmd.ProcessState.ExitCode()
		}
		exited = true
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return exit.ExitCode()
			}
			return 0
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Error("kibotos did not stop within 15 s of SIGTERM")
			return -1
		}
	}
	t.Cleanup(func() { stop() })
	// A process that never serves is killed, which ends the scan below.
	never := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
	defer never.Stop()
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		if m := servingAddr.FindStringSubmatch(lines.Text()); m != nil {
			go io.Copy(io.Discard, stderr)
			return printed(), m[1], stop
		}
	}
	stop()
	t.Fatalf("kibotos up exited before serving; stdout:\n%s", printed())
	return "", "", nil
}
