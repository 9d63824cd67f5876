package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/spf13/cobra"
)

// TestUpBootstrapsServesAndStopsOnSIGTERM runs the real binary: the first
// start prints and stores an admin token, the CLI finds it, SIGTERM stops
// the process cleanly, and a second start keeps the same deployment.
func TestUpBootstrapsServesAndStopsOnSIGTERM(t *testing.T) {
	hosttest.RequireRoot(t)
	bin := build(t)
	home := filepath.Join(t.TempDir(), "home")

	up := startUp(t, bin, home)
	stdout, addr := up.printed(), up.addr
	secret := adminToken(t, home)
	if fi, _ := os.Stat(filepath.Join(home, "admin-token")); fi.Mode().Perm() != 0o600 {
		t.Errorf("admin-token mode %v, want 0600", fi.Mode().Perm())
	}
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
	if code := up.stop(); code != 0 {
		t.Fatalf("exit code after SIGTERM = %d, want 0", code)
	}

	up = startUp(t, bin, home)
	stdout, addr = up.printed(), up.addr
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

// TestUpRefusesTmpfsShare: a share of memory for the guests' /tmp and
// /run outside 1 to 100 percent is refused before anything is set up.
func TestUpRefusesTmpfsShare(t *testing.T) {
	for _, pct := range []string{"0", "101", "-5"} {
		expectRefused(t, upCommand, "--guest-tmpfs-percent", "--guest-tmpfs-percent", pct)
	}
}

// TestUpRefusesGuestConnections: a bound of a workspace's connections
// outside 1 to 65536 is refused before anything is set up.
func TestUpRefusesGuestConnections(t *testing.T) {
	for _, n := range []string{"0", "65537", "-1"} {
		expectRefused(t, upCommand, "--guest-connections", "--guest-connections", n)
	}
}

// TestUpRefusesOvercommit: an overcommit factor below 1 or above 64 is
// refused before anything is set up.
func TestUpRefusesOvercommit(t *testing.T) {
	for _, c := range [][2]string{
		{"--cpu-overcommit", "0.5"}, {"--cpu-overcommit", "65"},
		{"--memory-overcommit", "0"}, {"--memory-overcommit", "-2"}, {"--memory-overcommit", "NaN"},
	} {
		expectRefused(t, upCommand, "overcommit "+c[1], c[0], c[1])
	}
}

// TestUpRefusesMetricsTokenFile: a metrics token file that is missing or
// holds no token is refused before anything is set up.
func TestUpRefusesMetricsTokenFile(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{empty, filepath.Join(t.TempDir(), "missing")} {
		expectRefused(t, upCommand, "metrics token", "--metrics-token-file", file)
	}
}

// TestUpRefusesRegistryCAFile: --registry-ca-file reaches the deployment,
// which refuses a file without a certificate before it sets anything up.
func TestUpRefusesRegistryCAFile(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	expectRefused(t, upCommand, "registry CA file", "--listen", "127.0.0.1:0", "--registry-ca-file", notPEM)
}

// TestUpRefusesGuestMemoryThresholds: a window under 100ms, a stall share
// outside 1 to 100 percent and a kill delay that is not positive are
// refused before anything is set up.
func TestUpRefusesGuestMemoryThresholds(t *testing.T) {
	for _, c := range [][2]string{
		{"--guest-memory-window", "50ms"},
		{"--guest-memory-stall-percent", "0"},
		{"--guest-memory-stall-percent", "101"},
		{"--guest-memory-kill-after", "0s"},
		{"--guest-memory-kill-after", "-1s"},
	} {
		expectRefused(t, upCommand, c[0], c[0], c[1])
	}
}

// expectRefused runs the command newCmd returns with --home HOME and args,
// and fails t unless it returns an error that contains want and leaves
// HOME uncreated: a refusal before anything is set up.
func expectRefused(t *testing.T, newCmd func() *cobra.Command, want string, args ...string) {
	t.Helper()
	home := filepath.Join(t.TempDir(), "home")
	cmd := newCmd()
	cmd.SetArgs(append([]string{"--home", home}, args...))
	cmd.SetOut(new(strings.Builder))
	cmd.SetErr(new(strings.Builder))
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("%s %v: %v, want an error with %q", cmd.Name(), args, err, want)
	}
	if _, err := os.Stat(home); !os.IsNotExist(err) {
		t.Errorf("%s %v created its home: %v", cmd.Name(), args, err)
	}
}
