package main

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestExposeCLI exposes a port of a real workspace with the CLI of the real
// binary, on a deployment given its --public-url (written with a trailing
// slash), lists the exposures, revokes one and refuses a bad port.
func TestExposeCLI(t *testing.T) {
	hosttest.RequireContainers(t)
	bin := build(t)
	home := t.TempDir()
	var lns []net.Listener
	for range 2 { // held together, so that the two ports differ
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
	}
	addr, exposureAddr := lns[0].Addr().String(), lns[1].Addr().String()
	lns[0].Close()
	lns[1].Close()
	up := startUp(t, bin, home, "--listen", addr, "--public-url", "http://"+addr+"/",
		"--exposure-listen", exposureAddr, "--exposure-public-url", "http://"+exposureAddr)
	cli := func(args ...string) string { return runCLI(t, bin, home, up.addr, args...) }
	var created ctrlv1.CreateWorkspaceResponse
	if err := protojson.Unmarshal([]byte(cli("ws", "create", "--memory", "128Mi", "--disk", "64Mi", "--wait", "-o", "json")), &created); err != nil {
		t.Fatal(err)
	}
	ws := created.Workspace.WorkspaceId
	t.Cleanup(func() { cli("ws", "delete", ws, "--wait") })
	server := exec.Command(bin, "ws", "exec", "--tag", "web", ws, "--", "httpd", "-f", "-p", "8080", "-h", "/etc")
	server.Env = append(os.Environ(), "KIBOTOS_HOME="+home, "KIBOTOS_ADDR="+up.addr)
	var serverOut strings.Builder
	server.Stdout, server.Stderr = &serverOut, &serverOut
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })

	// The table, then the token alone on the last line.
	out := strings.Split(strings.TrimSpace(cli("ws", "expose", ws, "8080")), "\n")
	if len(out) != 3 || !strings.HasPrefix(out[0], "ID ") {
		t.Fatalf("ws expose printed %q", out)
	}
	id, token := strings.Fields(out[1])[0], out[2]
	url := "http://" + exposureAddr + "/x/" + id + "/"
	if !strings.Contains(out[1], url) || !strings.HasPrefix(token, id+".") {
		t.Fatalf("ws expose printed %q", out)
	}
	var kept ctrlv1.CreateExposureResponse
	if err := protojson.Unmarshal([]byte(cli("ws", "expose", ws, "9090", "--public", "--persistent", "-o", "json")), &kept); err != nil {
		t.Fatal(err)
	}
	if x := kept.Exposure; x.Auth != ctrlv1.ExposureAuth_EXPOSURE_AUTH_PUBLIC || !x.Persistent || x.Token != "" {
		t.Errorf("--public --persistent: %v", x)
	}
	var list ctrlv1.ListExposuresResponse
	if err := protojson.Unmarshal([]byte(cli("ws", "exposures", ws, "-o", "json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Exposures) != 2 || list.Exposures[0].ExposureId != id || list.Exposures[1].ExposureId != kept.Exposure.ExposureId {
		t.Errorf("ws exposures: %v", list.Exposures)
	}

	local := url
	var passwd string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodGet, local+"passwd", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			passwd = string(b)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the exposure answers %d %q; the server printed %q", resp.StatusCode, b, serverOut.String())
		}
	}
	if !strings.HasPrefix(passwd, "root:") {
		t.Errorf("/etc/passwd through the exposure: %q", passwd)
	}
	if got := cli("exposure", "revoke", id); got != "revoked exposure "+id+"\n" {
		t.Errorf("exposure revoke printed %q", got)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodGet, local+"passwd", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoked exposure still answers %d", resp.StatusCode)
		}
	}

	bad := exec.Command(bin, "ws", "expose", ws, "0")
	bad.Env = append(os.Environ(), "KIBOTOS_HOME="+home, "KIBOTOS_ADDR="+up.addr)
	if b, err := bad.CombinedOutput(); err == nil || !strings.HasPrefix(string(b), "kibotos: invalid_argument:") {
		t.Errorf("ws expose WS 0: %v %q", err, b)
	}
}
