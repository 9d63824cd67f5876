package cli

import (
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/testtls"
)

// local runs a command that calls no server and wants success.
func (e *env) local(t *testing.T, args ...string) (stdout string) {
	t.Helper()
	stdout, stderr, err := e.run(t, "", args...)
	if err != nil {
		t.Fatalf("kibotos %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr)
	}
	return stdout
}

// TestContextsChooseTheServer adds two contexts, one of the test's server
// and one of nowhere, and checks which one each way of choosing picks:
// the current context, --context, KIBOTOS_CONTEXT, and the flags that win
// over all of them.
func TestContextsChooseTheServer(t *testing.T) {
	e := newEnv(t)
	tokenFile := writeFile(t, "token", e.token+"\nsecond line\n")
	badToken := writeFile(t, "bad-token", "not-a-token\n")
	nowhere := testutil.ClosedURL(t)
	get := func(args ...string) (string, error) {
		stdout, stderr, err := e.run(t, "", append([]string{"egress", "get", e.egress.GetEgressId()}, args...)...)
		if err != nil {
			return stderr, err
		}
		_, auth, _ := e.got()
		if len(auth) != 1 || auth[0] != "Bearer "+e.token {
			t.Errorf("Authorization = %v, want the context's token", auth)
		}
		return stdout, nil
	}

	if _, err := get(); err == nil {
		t.Fatal("a command without a context, token or admin-token succeeded")
	}
	e.local(t, "context", "add", "here", "--addr", e.addr, "--token-file", tokenFile)
	e.local(t, "context", "add", "away", "--addr", nowhere, "--token-file", badToken)
	if _, err := get(); err != nil {
		t.Fatalf("with the first context added current: %v", err)
	}

	path := filepath.Join(os.Getenv("XDG_CONFIG_HOME"), "kibotos", "contexts.yaml")
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, st.Mode().Perm())
	}

	_, _, err = e.run(t, "", "egress", "get", e.egress.GetEgressId(), "--context", "away")
	if err == nil || !strings.Contains(err.Error(), "cannot reach the Kibotos server at "+nowhere) {
		t.Errorf("--context away: %v, want the server at %s unreachable", err, nowhere)
	}
	t.Setenv(envContext, "away")
	if _, _, err := e.run(t, "", "egress", "get", e.egress.GetEgressId()); err == nil {
		t.Error("KIBOTOS_CONTEXT=away reached the server")
	}
	if _, err := get("--context", "here"); err != nil {
		t.Errorf("--context wins over %s: %v", envContext, err)
	}
	if _, err := get("--addr", e.addr, "--token", e.token); err != nil {
		t.Errorf("--addr and --token win over the context: %v", err)
	}
	t.Setenv(envContext, "")

	e.local(t, "context", "use", "away")
	stdout := e.local(t, "context", "list")
	if !strings.Contains(stdout, "*         away") || strings.Contains(stdout, e.token) {
		t.Errorf("context list marks not away current, or shows a token:\n%s", stdout)
	}
	if _, _, err := e.run(t, "", "egress", "get", e.egress.GetEgressId()); err == nil {
		t.Error("the current context away reached the server")
	}
	// The environment wins over the current context, not over a named one.
	t.Setenv(envAddr, e.addr)
	t.Setenv(envToken, e.token)
	if _, err := get(); err != nil {
		t.Errorf("KIBOTOS_ADDR and KIBOTOS_TOKEN over the current context: %v", err)
	}
	if _, _, err := e.run(t, "", "egress", "get", e.egress.GetEgressId(), "--context", "away"); err == nil {
		t.Error("--context away lost to KIBOTOS_ADDR")
	}
	t.Setenv(envAddr, "")
	t.Setenv(envToken, "")

	if _, stderr, err := e.run(t, "", "context", "remove", "away"); err != nil || !strings.Contains(stderr, "no context is current now") ||
		!strings.Contains(stderr, "kibotos context use here") {
		t.Errorf("removing the current context: %v, %q; want it to say none is current and how to pick another", err, stderr)
	}
	if stdout := e.local(t, "context", "list"); strings.Contains(stdout, "away") || strings.Contains(stdout, "*") {
		t.Errorf("after remove:\n%s", stdout)
	}
	if _, _, err := e.run(t, "", "egress", "get", e.egress.GetEgressId()); err == nil {
		t.Error("with no current context and no token, a command succeeded")
	}
}

func TestContextRefusals(t *testing.T) {
	e := newEnv(t)
	tokenFile := writeFile(t, "token", e.token)
	e.local(t, "context", "add", "here", "--addr", e.addr, "--token-file", tokenFile)
	before := e.local(t, "context", "list")
	notPEM := writeFile(t, "ca.pem", "not a certificate")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"context", "add", "here", "--addr", e.addr, "--token-file", tokenFile}, `context "here" exists`},
		{[]string{"context", "add", "x", "--addr", "ftp://h", "--token-file", tokenFile}, "want host:port or an http:// or https:// URL"},
		{[]string{"context", "add", "x", "--addr", e.addr, "--token-file", writeFile(t, "empty", "\n")}, "the first line is empty"},
		{[]string{"context", "add", "x", "--addr", e.addr, "--token-file", "/nonexistent"}, "no such file"},
		{[]string{"context", "add", "x", "--addr", e.addr, "--token-file", tokenFile, "--ca-file", notPEM}, "holds no PEM certificate"},
		{[]string{"context", "add", "x", "--addr", e.addr}, `"token-file" not set`},
		{[]string{"context", "use", "nope"}, `no context "nope"`},
		{[]string{"context", "remove", "nope"}, `no context "nope"`},
		{[]string{"egress", "list", "--context", "nope"}, `no context "nope"`},
	} {
		if _, _, err := e.run(t, "", tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
	if after := e.local(t, "context", "list"); after != before {
		t.Errorf("refused commands changed the contexts:\n%s\nwas\n%s", after, before)
	}
}

// TestContextCAFile reaches the server through a TLS proxy whose
// certificate a private authority signed: with the context's CA file, and
// not without it.
func TestContextCAFile(t *testing.T) {
	e := newEnv(t)
	serverTLS, caPEM := testtls.New(t, "127.0.0.1")
	target, err := url.Parse(e.addr)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewUnstartedServer(httputil.NewSingleHostReverseProxy(target))
	proxy.TLS = serverTLS
	proxy.StartTLS()
	t.Cleanup(proxy.Close)
	ca := writeFile(t, "ca.pem", caPEM)
	token := writeFile(t, "token", e.token)

	e.local(t, "context", "add", "tls", "--addr", proxy.URL, "--token-file", token, "--ca-file", ca)
	e.local(t, "context", "add", "untrusted", "--addr", proxy.URL, "--token-file", token)
	if stdout := e.local(t, "context", "list"); !strings.Contains(stdout, ca) {
		t.Errorf("context list lacks the CA file %s:\n%s", ca, stdout)
	}
	if _, _, err := e.run(t, "", "egress", "get", e.egress.GetEgressId(), "--context", "tls"); err != nil {
		t.Errorf("through the context's CA file: %v", err)
	}
	if _, _, err := e.run(t, "", "egress", "get", e.egress.GetEgressId(), "--context", "untrusted"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("without a CA file: %v, want a certificate error", err)
	}
}

// TestArgumentNotText: an argument that is not UTF-8 text, which the
// client cannot send, is named in the error, not reported as internal.
func TestArgumentNotText(t *testing.T) {
	e := newEnv(t)
	args := []string{"egress", "get", "egr_\xff", "--addr", e.addr, "--token", e.token}
	_, _, err := e.run(t, "", args...)
	if err == nil {
		t.Fatal("a call with an argument that is not UTF-8 succeeded")
	}
	if got := explainText(err, args).Error(); !strings.HasPrefix(got, "invalid_argument: ") || !strings.Contains(got, `"egr_\xff"`) {
		t.Errorf("explained: %q (from %v), want invalid_argument naming the argument", got, err)
	}
}
