package daemon_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/testutil/nettest"
)

// TestBuiltinNetworkTools: in a workspace of the built-in template base,
// wget (with a timeout), nc and nslookup reach a test host by name under
// PUBLIC_INTERNET.
func TestBuiltinNetworkTools(t *testing.T) {
	e := newNetEnv(t)
	web := e.inet.Listen(t, "tcp4", nettest.HostIPv4.String()+":0")
	go http.Serve(web, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello from the test host")
	}))
	e.awaitApplied(1)
	e.setPolicy(public(nil))

	url := fmt.Sprintf("http://internet.test:%d/", web.Addr().(*net.TCPAddr).Port)
	if out, err := e.exec(e.ws, "wget", "-q", "-T", "10", "-O", "-", url); err != nil || out != "hello from the test host" {
		t.Errorf("wget %s: %q, %v", url, out, err)
	}
	if out, err := e.exec(e.ws, "sh", "-c", fmt.Sprintf("echo over nc | nc -w 10 internet.test %d", e.v4.port)); err != nil || out != "over nc\n" {
		t.Errorf("nc: %q, %v", out, err)
	}
	if out, err := e.exec(e.ws, "nslookup", "internet.test"); err != nil || !strings.Contains(out, nettest.HostIPv4.String()) {
		t.Errorf("nslookup: %q, %v", out, err)
	}
}
