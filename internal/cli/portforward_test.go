package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos/internal/testutil"
)

func TestParsePortPairs(t *testing.T) {
	pairs, err := parsePortPairs([]string{"8080:80", ":5432", "0:22", "3000"})
	want := []portPair{{8080, 80}, {0, 5432}, {0, 22}, {3000, 3000}}
	if err != nil || fmt.Sprint(pairs) != fmt.Sprint(want) {
		t.Errorf("parsePortPairs = %v, %v; want %v", pairs, err, want)
	}
	for _, bad := range []string{"0", "80:0", "80:", "70000:80", "80:70000", "a:80", "80:b", "1:2:3", "-1:80"} {
		if _, err := parsePortPairs([]string{bad}); err == nil {
			t.Errorf("parsePortPairs(%q) accepted", bad)
		}
	}
}

// forwarding is a `ws port-forward` running in-process.
type forwarding struct {
	stop   context.CancelFunc
	done   chan error
	stderr *testutil.SyncBuffer
	// local maps each remote port to the local address forwarded to it.
	local map[string]string
}

var forwardingLine = regexp.MustCompile(`Forwarding from (\S+) -> (\d+)\n`)

// portForward runs `kibotos ws port-forward ID pairs...` until the test
// ends, once it has printed a line for each pair.
func (e *env) portForward(t *testing.T, id string, pairs ...string) *forwarding {
	t.Helper()
	root := &cobra.Command{Use: "kibotos", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(Commands()...)
	var stdout testutil.SyncBuffer
	f := &forwarding{done: make(chan error, 1), stderr: new(testutil.SyncBuffer), local: map[string]string{}}
	root.SetArgs(append([]string{"ws", "port-forward", "--addr", e.addr, "--token", e.token, id}, pairs...))
	root.SetOut(&stdout)
	root.SetErr(f.stderr)
	ctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	go func() { f.done <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-f.done; !errors.Is(err, context.Canceled) {
			t.Errorf("port-forward ended with %v, want the interrupt's context.Canceled", err)
		}
	})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		lines := forwardingLine.FindAllStringSubmatch(stdout.String(), -1)
		if len(lines) == len(pairs) {
			for _, l := range lines {
				f.local[l[2]] = l[1]
			}
			return f
		}
		select {
		case err := <-f.done:
			t.Fatalf("port-forward ended: %v\nstderr: %s", err, f.stderr.String())
		default:
		}
	}
	t.Fatalf("port-forward printed %q", stdout.String())
	return nil
}

// serveInGuest starts a server in the workspace and waits until it
// listens on port (looked up in /proc/net, not by connecting).
func (e *env) serveInGuest(t *testing.T, id string, port int, script string) {
	t.Helper()
	if _, stderr, err := e.runData(t, "", "ws", "exec", id, "--", "sh", "-c", script+" >/dev/null 2>&1 &"); err != nil {
		t.Fatalf("%q: %v\n%s", script, err, stderr)
	}
	listening := fmt.Sprintf(`awk '$4 == "0A" && $2 ~ /:%04X$/ { found = 1 } END { exit !found }' /proc/net/tcp /proc/net/tcp6`, port)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, _, err := e.runData(t, "", "ws", "exec", id, "--", "sh", "-c", listening); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q never listened on port %d", script, port)
		}
	}
}

// forwardedConn serves script on port in the workspace, forwards the port
// until the test ends and returns the forwarding and a connection through
// it, closed when the test ends.
func (e *env) forwardedConn(t *testing.T, id string, port int, script string) (*forwarding, net.Conn) {
	t.Helper()
	e.serveInGuest(t, id, port, script)
	name := strconv.Itoa(port)
	f := e.portForward(t, id, ":"+name)
	c, err := net.Dial("tcp", f.local[name])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return f, c
}

// get fetches a URL and returns its body.
func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return body
}

// TestPortForward forwards a picked local port to a web server on the
// guest's loopback, and a second one to a closed port: that connection
// fails and is reported, the forwarding goes on.
func TestPortForward(t *testing.T) {
	e, id := newDataEnv(t)
	e.sh(t, id, "mkdir -p /tmp/www && echo 'hello through the tunnel' > /tmp/www/index.html")
	e.serveInGuest(t, id, 8000, "httpd -f -p 127.0.0.1:8000 -h /tmp/www")
	f := e.portForward(t, id, ":8000", "0:9999")
	url := "http://" + f.local["8000"] + "/index.html"
	if body := get(t, url); string(body) != "hello through the tunnel\n" {
		t.Errorf("body %q", body)
	}

	c, err := net.Dial("tcp", f.local["9999"])
	if err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Errorf("a connection to a closed guest port read %d bytes, %v", n, err)
	}
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(f.stderr.String(), "port 9999"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no error reported: stderr %q", f.stderr.String())
		}
	}
	if !strings.Contains(f.stderr.String(), "unavailable") {
		t.Errorf("stderr %q", f.stderr.String())
	}
	if body := get(t, url); string(body) != "hello through the tunnel\n" {
		t.Errorf("after a failed connection: body %q", body)
	}
}

// TestPortForwardConcurrent sends 200 connections at once through one
// forwarded port, each a download that must arrive whole.
func TestPortForwardConcurrent(t *testing.T) {
	e, id := newDataEnv(t)
	// 256 KiB of pseudo-random bytes.
	e.sh(t, id, "mkdir -p /tmp/www && head -c 262144 /dev/urandom > /tmp/www/blob")
	want := sha256.Sum256(e.download(t, id, "/tmp/www/blob"))
	e.serveInGuest(t, id, 8000, "httpd -f -p 127.0.0.1:8000 -h /tmp/www")
	f := e.portForward(t, id, ":8000")
	url := "http://" + f.local["8000"] + "/blob"
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	const conns = 200
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	start := make(chan struct{})
	for range conns {
		wg.Go(func() {
			<-start
			resp, err := client.Get(url)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			h := sha256.New()
			if _, err := io.Copy(h, resp.Body); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(h.Sum(nil), want[:]) {
				errs <- fmt.Errorf("a download's bytes differ")
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s := f.stderr.String(); s != "" {
		t.Errorf("port-forward reported: %s", s)
	}
}

// download reads a guest file with `ws exec cat`.
func (e *env) download(t *testing.T, id, path string) []byte {
	t.Helper()
	out, stderr, err := e.runData(t, "", "ws", "exec", id, "--", "cat", path)
	if err != nil {
		t.Fatalf("cat %s: %v\n%s", path, err, stderr)
	}
	return []byte(out)
}

// TestPortForwardRefusedBeforeListening: a token that may not reach the
// data plane (a viewer's) is refused before any port is listened on.
func TestPortForwardRefusedBeforeListening(t *testing.T) {
	e, id := newDataEnv(t)
	t.Setenv(envSessionCache, "off")
	out, _, err := e.runData(t, "", "token", "create", "--role", "viewer", "--name", "looker")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	stdout, _, err := e.run(t, "", "ws", "port-forward", "--addr", e.addr, "--token", lines[len(lines)-1], id, "0:80")
	if connect.CodeOf(err) != connect.CodePermissionDenied || strings.Contains(stdout, "Forwarding") {
		t.Errorf("port-forward with a viewer's token: %v, stdout %q", err, stdout)
	}
}

// TestPortForwardNamesItsAddresses: an empty --address, or an empty entry
// in it, is refused before anything listens: it would listen on every
// interface.
func TestPortForwardNamesItsAddresses(t *testing.T) {
	e, id := newDataEnv(t)
	for _, addrs := range []string{"", ",", "127.0.0.1,", " "} {
		stdout, _, err := e.runData(t, "", "ws", "port-forward", "--address", addrs, id, "0:80")
		if err == nil || !strings.Contains(err.Error(), "--address") || strings.Contains(stdout, "Forwarding") {
			t.Errorf("--address %q: %v, stdout %q; want refused before listening", addrs, err, stdout)
		}
	}
}

// TestPortForwardEndsWithItsWorkspace: once a connection finds the
// workspace deleted, port-forward ends with that error: no later
// connection could reach it.
func TestPortForwardEndsWithItsWorkspace(t *testing.T) {
	e, id := newDataEnv(t)
	f := e.portForward(t, id, "0:80")
	if _, stderr, err := e.runData(t, "", "ws", "delete", id, "--wait"); err != nil {
		t.Fatalf("delete: %v\n%s", err, stderr)
	}
	c, err := net.Dial("tcp", f.local["80"])
	if err != nil {
		t.Fatal(err)
	}
	c.Read(make([]byte, 1))
	c.Close()
	if err := f.ended(t, 30*time.Second); err == nil || !strings.Contains(err.Error(), "DELETED") && connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("port-forward of a deleted workspace ended with %v", err)
	}
}

// ended waits within for the port-forward to end by itself (the test
// fails when it does not) and returns its error.
func (f *forwarding) ended(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-f.done:
		t.Logf("port-forward ended with %v", err)
		f.done <- context.Canceled // what the test's cleanup waits for, as from an interrupt
		return err
	case <-time.After(within):
		t.Fatalf("port-forward of a deleted workspace still runs; stderr %q", f.stderr.String())
		return nil
	}
}

// TestPortForwardEndsWhenItsWorkspaceIsDeleted: a forwarded connection
// open, and idle, while its workspace is deleted ends at once, and
// port-forward ends with the deletion without waiting for another
// connection.
func TestPortForwardEndsWhenItsWorkspaceIsDeleted(t *testing.T) {
	e, id := newDataEnv(t)
	f, c := e.forwardedConn(t, id, 9001, "nc -l -p 9001 -e sh -c 'echo hello; sleep 600'")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	hello := make([]byte, len("hello\n"))
	if _, err := io.ReadFull(c, hello); err != nil || string(hello) != "hello\n" {
		t.Fatalf("the service's greeting: %q, %v", hello, err)
	}
	if _, stderr, err := e.runData(t, "", "ws", "delete", id, "--wait"); err != nil {
		t.Fatalf("delete: %v\n%s", err, stderr)
	}
	deleted := time.Now()
	c.SetReadDeadline(deleted.Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a connection open while its workspace was deleted: read %d bytes, %v, want it ended", n, err)
	}
	if err := f.ended(t, 15*time.Second); err == nil || !strings.Contains(err.Error(), "DELETED") && !strings.Contains(err.Error(), "DELETING") && connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("port-forward of a deleted workspace ended with %v", err)
	}
}

// TestPortForwardResetsACutConnection: a guest service that resets its
// connection after some bytes resets the local one, rather than ending it
// as if it had sent everything.
func TestPortForwardResetsACutConnection(t *testing.T) {
	e, id := newDataEnv(t)
	// The service does not read what the caller sent: closing its socket
	// with bytes unread resets the connection.
	f, c := e.forwardedConn(t, id, 9002, "nc -l -p 9002 -e sh -c 'echo partial; sleep 1'")
	if _, err := c.Write([]byte("unread\n")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a connection the guest's service reset: read %q, then %v; want a reset", got, err)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(f.stderr.String(), "reset"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no reset reported: stderr %q", f.stderr.String())
		}
	}
}
