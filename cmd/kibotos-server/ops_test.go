package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos/internal/buildinfo"
	"github.com/kibotos/kibotos/internal/config"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// TestVersionCommand: version prints what the build recorded.
func TestVersionCommand(t *testing.T) {
	cmd := rootCommand()
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"version", "-o", "json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var got buildinfo.Info
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
		t.Fatalf("version -o json: %v: %s", err, out.String())
	}
	if got != buildinfo.Get() || got.GoVersion == "" || got.Version == "" {
		t.Errorf("version = %+v, want %+v", got, buildinfo.Get())
	}
	// Keys in lowerCamelCase, as every -o json of the CLI.
	if !strings.Contains(out.String(), `"goVersion"`) {
		t.Errorf("version -o json: %s, want the key goVersion", out.String())
	}
}

// TestInterruptedCommand: a CLI command cut short by SIGTERM, SIGINT or SIGHUP
// (here one waiting on a server that never answers) exits as a shell
// reports a command a signal ended, 128 plus the signal, and says so,
// not "context canceled".
func TestInterruptedCommand(t *testing.T) {
	bin := build(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- conn // held open, never answered
		}
	}()
	start := func(argv ...string) (*exec.Cmd, *strings.Builder) {
		t.Helper()
		cmd := exec.Command(argv[0], append(argv[1:], "ws", "list")...)
		cmd.Env = append(os.Environ(), "KIBOTOS_HOME="+t.TempDir(), "KIBOTOS_ADDR="+ln.Addr().String(), "KIBOTOS_TOKEN=t")
		stderr := new(strings.Builder)
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case conn := <-accepted:
			t.Cleanup(func() { conn.Close() })
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatal("the CLI never connected")
		}
		return cmd, stderr
	}
	for _, c := range []struct {
		sig  syscall.Signal
		code int
		says string
	}{{syscall.SIGTERM, 143, "interrupted by SIGTERM"}, {syscall.SIGINT, 130, "interrupted by SIGINT"}, {syscall.SIGHUP, 129, "interrupted by SIGHUP"}} {
		cmd, stderr := start(bin)
		cmd.Process.Signal(c.sig)
		cmd.Wait()
		if got := cmd.ProcessState.ExitCode(); got != c.code || !strings.Contains(stderr.String(), c.says) {
			t.Errorf("ws list cut short by %v: exit %d, %q; want %d and %q", c.sig, got, stderr.String(), c.code, c.says)
		}
	}

	// Started with SIGHUP ignored (nohup, as make up starts kibotos up), it
	// keeps ignoring it.
	cmd, stderr := start("nohup", bin)
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	cmd.Process.Signal(syscall.SIGHUP) // the CLI, nohup's exec: it connected

	select {
	case <-exited:
		t.Errorf("a CLI started under nohup ended on SIGHUP: exit %d, %q", cmd.ProcessState.ExitCode(), stderr.String())
	case <-time.After(time.Second):
		cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	}
}

// TestOperations runs a binary linked with a version: `kibotos version`
// prints it; `kibotos up --config FILE` reads its settings from the file
// (JSON logs, pprof on loopback), logs the version at start and one JSON
// access line per call, and serves /healthz, /readyz, the build in
// /metrics and the profiles.
func TestOperations(t *testing.T) {
	hosttest.RequireRoot(t)
	bin := build(t, "-ldflags", "-X github.com/kibotos/kibotos/internal/buildinfo.version=v9.8.7 -X github.com/kibotos/kibotos/internal/buildinfo.commit=0123abc")
	dir := t.TempDir()
	out, err := exec.Command(bin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "kibotos v9.8.7\ncommit: 0123abc\ngo: go1.") {
		t.Fatalf("kibotos version: %v\n%s", err, out)
	}

	config := filepath.Join(dir, "config.yaml")
	home := filepath.Join(dir, "home")
	if err := os.WriteFile(config, []byte("home: "+home+"\nlisten: 127.0.0.1:0\ndesktop-cache: \"\"\nlog-format: json\nlog-level: debug\npprof-listen: 127.0.0.1:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	up := exec.Command(bin, "up", "--config", config, "--log-level", "info")
	stderr, err := up.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan map[string]any, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("log line is not JSON: %s", sc.Text())
				continue
			}
			lines <- m
		}
	}()
	defer func() {
		up.Process.Signal(syscall.SIGTERM)
		for range lines {
		}
		up.Wait()
	}()
	var addr, pprofAddr string
	var started map[string]any
	for addr == "" {
		select {
		case m, ok := <-lines:
			if !ok {
				t.Fatal("kibotos up ended before it was ready")
			}
			switch m["msg"] {
			case "kibotos starting":
				started = m
			case "serving pprof":
				pprofAddr, _ = m["addr"].(string)
			case "ready":
				addr, _ = m["addr"].(string)
			}
			if m["level"] == "DEBUG" {
				t.Errorf("a debug line with --log-level info on the command line over the file's debug: %v", m)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("kibotos up did not become ready")
		}
	}
	if started["version"] != "v9.8.7" || started["commit"] != "0123abc" {
		t.Errorf("start line = %v", started)
	}
	base := "http://" + addr
	for path, want := range map[string]string{
		"/healthz": "ok\n",
		"/readyz":  "ready\n",
		"/metrics": `kibotos_build_info{commit="0123abc",go_version="`,
	} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET %s = %d, want %q in it", path, resp.StatusCode, want)
		}
	}
	if pprofAddr == "" {
		t.Fatal("pprof is not served")
	}
	resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/cmdline")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("pprof: %v %v", resp, err)
	}
	resp.Body.Close()

	cli := exec.Command(bin, "template", "get", "base", "--addr", addr, "--token", adminToken(t, home))
	if out, err := cli.CombinedOutput(); err != nil {
		t.Fatalf("template get: %v\n%s", err, out)
	}
	for {
		select {
		case m := <-lines:
			if m["msg"] == "call" && m["method"] == "/kibotos.ctrl.v1.TemplateService/GetTemplate" {
				if m["code"] != "ok" || m["project"] == "" || len(m["request_id"].(string)) != 16 || m["latency"] == nil {
					t.Errorf("access line = %v", m)
				}
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no access line for the call")
		}
	}
}

// A lone host agent refuses an OTLP endpoint it cannot export to before
// anything is set up.
func TestHostRefusesOTLPEndpoint(t *testing.T) {
	expectRefused(t, hostCommand, "OTLP endpoint", "--ctrl", "http://127.0.0.1:1", "--token-file", filepath.Join(t.TempDir(), "token"),
		"--otlp-endpoint", "collector:4318")
}

// The sample configuration that `make install` puts in /etc/kibotos is
// one that up and ctrl take.
func TestSampleConfig(t *testing.T) {
	for _, cmd := range []*cobra.Command{upCommand(), ctrlCommand()} {
		if err := config.Apply(cmd.Flags(), "../../deploy/config.yaml"); err != nil {
			t.Errorf("%s: %v", cmd.Name(), err)
		}
	}
}

// Operations settings that cannot work are refused before anything is set
// up.
func TestUpRefusesOpsFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--log-format", "xml"}, "log format"},
		{[]string{"--log-level", "loud"}, "log level"},
		{[]string{"--pprof-listen", "0.0.0.0:6060"}, "loopback"},
		{[]string{"--otlp-endpoint", "collector:4318"}, "OTLP endpoint"},
		{[]string{"--insecure-registry", "http://registry.lan"}, "--insecure-registry"},
		{[]string{"--config", "/nonexistent/config.yaml"}, "config"},
	} {
		expectRefused(t, upCommand, c.want, c.args...)
	}
}
