package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"github.com/coder/websocket"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/exposureabi"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/ctrltest"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// webappPackage is the guest-side server of these tests.
const webappPackage = "github.com/kibotos/kibotos/internal/testutil/webapp"

// startWebapp builds the test web server, copies it into the workspace
// with the file API and starts it with the process API on each port.
func startWebapp(t *testing.T, ws *sdk.Workspace, ports ...int) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "webapp")
	if err := testutil.Build(bin, webappPackage); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx := context.Background()
	if _, err := ws.Upload(ctx, f, "/root/webapp", 0o755); err != nil {
		t.Fatal(err)
	}
	runWebapp(t, ws, ports...)
}

// exposedWebapp runs the test web server on each port in a new workspace
// of d and exposes the first port with the default options.
func (d *deployment) exposedWebapp(t *testing.T, ports ...int) (*sdk.Workspace, *sdk.Exposure) {
	t.Helper()
	ws := d.sdkWorkspace(256<<20, 256<<20)
	startWebapp(t, ws, ports...)
	x, err := ws.Expose(context.Background(), uint32(ports[0]), sdk.ExposeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ws, x
}

// runWebapp starts the copied server on each port and waits until each
// listens.
func runWebapp(t *testing.T, ws *sdk.Workspace, ports ...int) {
	t.Helper()
	ctx := context.Background()
	for _, port := range ports {
		if _, err := ws.Start(ctx, []string{"/root/webapp", "-addr", fmt.Sprintf(":%d", port)}, sdk.ExecOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, fmt.Sprintf("the web server on port %d", port), func() (int, error) {
			st, err := ws.Exec(ctx, []string{"wget", "-q", "-O", "/dev/null", fmt.Sprintf("http://127.0.0.1:%d/request?probe=ready", port)}, sdk.ExecOptions{})
			return st.Code, err
		}, func(code int) bool { return code == 0 })
	}
}

// guestRequests is what the web server recorded receiving.
func guestRequests(t *testing.T, ws *sdk.Workspace) string {
	t.Helper()
	b, err := ws.ReadFile(context.Background(), "/tmp/webapp-requests")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (d *deployment) exposures(token string) ctrlv1connect.ExposureServiceClient {
	return ctrlv1connect.NewExposureServiceClient(http.DefaultClient, d.url, connect.WithInterceptors(bearer.Token(token)))
}

func (d *deployment) adminToken() string {
	d.t.Helper()
	b, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		d.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// get sends a GET with header and returns the status and body.
func get(t *testing.T, client *http.Client, url string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if header != nil {
		req.Header = header
	}
	resp, b := testutil.Do(t, client, req)
	return resp.StatusCode, string(b)
}

// awaitRouted waits until the host routes an exposure: CreateExposure
// returns once the exposure is stored, and its host learns of it from the
// assignment ctrl pushes right after.
func awaitRouted(t *testing.T, url string) {
	t.Helper()
	eventually(t, 10*time.Second, "the host to route "+url, func() (int, error) {
		status, _ := get(t, http.DefaultClient, url, nil)
		return status, nil
	}, func(status int) bool { return status != http.StatusNotFound })
}

func bearerHeader(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }

// TestExposureBrowser loads a page with JavaScript from a guest server
// through a TOKEN exposure in headless Chromium: the one-time token sets
// the cookie, the page's WebSocket echoes, and the screenshot shows the
// page. A Go WebSocket client echoes too, with the token in its header.
func TestExposureBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("needs chromium (Debian package chromium; scripts/install-deps installs it)")
	}
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	ws, x := d.exposedWebapp(t, 8080)
	if !strings.HasSuffix(x.URL, "/x/"+x.ID+"/") || strings.HasPrefix(x.URL, d.url+"/") || x.Token == "" {
		t.Fatalf("exposure %+v: want a path URL on an origin apart from the API's, %s", x, d.url)
	}
	awaitRouted(t, x.URL)
	// The path on the API's listener is sent to the exposure's.
	if resp, _ := testutil.Do(t, noRedirect, mustRequest(t, d.url+"/x/"+x.ID+"/request?a=1")); resp.StatusCode != http.StatusPermanentRedirect ||
		resp.Header.Get("Location") != x.URL+"request?a=1" {
		t.Errorf("the path on the API's listener: %d to %q, want 308 to %srequest?a=1", resp.StatusCode, resp.Header.Get("Location"), x.URL)
	}

	// Go's WebSocket client, with the token in the header.
	wsURL := "ws" + strings.TrimPrefix(x.URL, "http") + "echo"
	conn, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: bearerHeader(x.Token)})
	if err != nil {
		t.Fatalf("WebSocket through the exposure: %v", err)
	}
	for i := range 3 {
		msg := fmt.Sprintf("message %d", i)
		if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := conn.Read(ctx); err != nil || string(got) != msg {
			t.Fatalf("echo %q, %v; want %q", got, err, msg)
		}
	}
	conn.Close(websocket.StatusNormalClosure, "")
	if _, _, err := websocket.Dial(ctx, wsURL, nil); err == nil {
		t.Error("a WebSocket without the token was accepted")
	}

	// Chromium, only against this loopback URL.
	alloc, cancel := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(chromium),
		// Its singleton socket's directory, which a browser that is
		// killed leaves, goes in the test's own.
		chromedp.Env("TMPDIR="+t.TempDir()),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-first-run", true), chromedp.Flag("disable-sync", true), chromedp.Flag("disable-default-apps", true))
	defer cancel()
	browser, cancel := chromedp.NewContext(alloc)
	defer cancel()
	browser, cancel = context.WithTimeout(browser, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(browser, chromedp.Navigate(x.URL+"?"+exposureabi.TokenParameter+"="+x.Token)); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	if _, err := chromedp.Run(browser, chromedp.Poll[bool](`document.getElementById("result").textContent.startsWith("echo")`)); err != nil {
		t.Fatalf("waiting for the page's WebSocket: %v", err)
	}
	result, err := chromedp.Run(browser, chromedp.Text("#result"))
	if err != nil {
		t.Fatal(err)
	}
	location, err := chromedp.Run(browser, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(browser, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if result != "echo: ping from the page" {
		t.Errorf("the page's WebSocket gave %q", result)
	}
	if location != x.URL {
		t.Errorf("the browser is at %q, want %q (the token dropped from the URL)", location, x.URL)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatal(err)
	}
	// The page is blue with white text: most pixels are the background,
	// some are the text.
	var blue, light, total int
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			total++
			switch {
			case r>>8 < 0x40 && bl>>8 > 0xb0:
				blue++
			case r>>8 > 0xd0 && g>>8 > 0xd0 && bl>>8 > 0xd0:
				light++
			}
		}
	}
	if blue < total/2 || light == 0 {
		t.Errorf("screenshot %dx%d: %d blue and %d light pixels of %d; the page did not render", b.Dx(), b.Dy(), blue, light, total)
	}
	if reqs := guestRequests(t, ws); strings.Contains(reqs, exposureabi.TokenParameter) {
		t.Errorf("the guest saw the token parameter:\n%s", reqs)
	}

	// Signed in to the web console, the same tab opens a guest page that
	// tries to read the console's token and to put a service worker over
	// its origin; then the console opens again, itself.
	admin := d.adminToken()
	if err := chromedp.Do(browser, chromedp.Navigate(d.url+"/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SetValue(chromedp.CSS("#token"), admin), chromedp.Click(chromedp.CSS(`form.signin button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS("#who-role"))); err != nil {
		t.Fatalf("signing in to the console: %v", err)
	}
	if err := chromedp.Do(browser, chromedp.Navigate(x.URL+"hostile")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(browser, chromedp.Poll[bool](`document.title.includes(" sw:")`)); err != nil {
		t.Fatalf("waiting for the hostile page: %v", err)
	}
	title, err := chromedp.Run(browser, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(title, "token:null ") {
		t.Errorf("the guest page read the console's token: %q", title)
	}
	if err := chromedp.Do(browser, chromedp.Navigate(d.url+"/"), chromedp.WaitVisible(chromedp.CSS("#who-role"))); err != nil {
		title, _ := chromedp.Run(browser, chromedp.Title())
		t.Fatalf("the console after the guest page (title %q): %v", title, err)
	}
}

// noRedirect is a client that returns redirects rather than following them.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// mustRequest is a GET of url.
func mustRequest(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestExposureLifecycle covers a TOKEN exposure's refusals and the ways
// its token is accepted, what the guest sees, streaming, concurrency,
// revocation, the end of an exposure with its execution and a persistent
// one's return after a start, a port nothing listens on, and refused
// CreateExposure calls that store nothing.
func TestExposureLifecycle(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ctx := context.Background()
	client := d.sdkClient()
	ws, x := d.exposedWebapp(t, 8080, 8081)
	kept, err := ws.Expose(ctx, 8081, sdk.ExposeOptions{Public: true, Persistent: true})
	if err != nil {
		t.Fatal(err)
	}
	awaitRouted(t, x.URL)
	awaitRouted(t, kept.URL)

	// Without the token: 401, and the guest saw nothing.
	if status, body := get(t, http.DefaultClient, x.URL+"request?probe=unauthenticated", nil); status != http.StatusUnauthorized || !strings.Contains(body, "token") {
		t.Errorf("without a token: %d %q", status, body)
	}
	if reqs := guestRequests(t, ws); strings.Contains(reqs, "unauthenticated") {
		t.Errorf("the guest saw a refused request:\n%s", reqs)
	}
	// The header: the guest sees the forwarding headers, not the token.
	status, body := get(t, http.DefaultClient, x.URL+"request?probe=header", bearerHeader(x.Token))
	if status != http.StatusOK {
		t.Fatalf("with the token: %d %q", status, body)
	}
	var seen struct {
		URI    string
		Host   string
		Header http.Header
	}
	if err := json.Unmarshal([]byte(body), &seen); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(x.URL[:strings.Index(x.URL, "/x/")], "http://")
	if seen.URI != "/request?probe=header" || seen.Host != host || seen.Header.Get("Authorization") != "" ||
		seen.Header.Get("X-Forwarded-For") != "127.0.0.1" || seen.Header.Get("X-Forwarded-Proto") != "http" ||
		seen.Header.Get("X-Forwarded-Host") != host || seen.Header.Get("X-Forwarded-Prefix") != "/x/"+x.ID {
		t.Errorf("the guest saw %+v", seen)
	}
	// A caller that asks for no encoding: the guest is asked for none.
	status, body = get(t, &http.Client{Transport: &http.Transport{DisableCompression: true}}, x.URL+"request?probe=identity", bearerHeader(x.Token))
	seen.Header = nil
	if err := json.Unmarshal([]byte(body), &seen); status != http.StatusOK || err != nil || seen.Header.Get("Accept-Encoding") != "" {
		t.Errorf("without Accept-Encoding: %d, the guest saw %v (%v)", status, seen.Header, err)
	}
	// The query parameter once, then the cookie.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	status, body = get(t, browser, x.URL+"request?a=1&"+exposureabi.TokenParameter+"="+x.Token, nil)
	if status != http.StatusOK || !strings.Contains(body, `"uri":"/request?a=1"`) || strings.Contains(body, x.Token) {
		t.Errorf("with the query token: %d %q", status, body)
	}
	if status, _ := get(t, browser, x.URL+"request?probe=cookie", nil); status != http.StatusOK {
		t.Errorf("with the cookie: %d", status)
	}
	if status, _ := get(t, noRedirect, x.URL+"request?"+exposureabi.TokenParameter+"=bad", nil); status != http.StatusUnauthorized {
		t.Errorf("with a bad query token: %d", status)
	}

	// Bodies stream both ways; HTTP/2 works; a PUBLIC exposure needs no token.
	const upload = 64 << 20
	req, _ := http.NewRequest(http.MethodPost, x.URL+"upload", io.LimitReader(zeroReader{}, upload))
	req.Header = bearerHeader(x.Token)
	resp, err := httpClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || string(got) != fmt.Sprint(upload) {
		t.Errorf("upload over %s: %q", resp.Proto, got)
	}
	if status, _ := get(t, http.DefaultClient, kept.URL+"request", nil); status != http.StatusOK {
		t.Errorf("PUBLIC exposure: %d", status)
	}

	// 200 connections at once through one exposure: every answer whole.
	const conns, size = 200, 1 << 20
	var wg sync.WaitGroup
	failures := make(chan string, conns)
	for i := range conns {
		wg.Go(func() {
			c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%szeros?n=%d&i=%d", x.URL, size, i), nil)
			req.Header = bearerHeader(x.Token)
			resp, err := c.Do(req)
			if err != nil {
				failures <- err.Error()
				return
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK || n != size || err != nil {
				failures <- fmt.Sprintf("connection %d: %d, %d bytes, %v", i, resp.StatusCode, n, err)
			}
		})
	}
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Error(f)
	}

	// A port nothing listens on: a 502 page.
	closed, err := ws.Expose(ctx, 9, sdk.ExposeOptions{Public: true})
	if err != nil {
		t.Fatal(err)
	}
	awaitRouted(t, closed.URL)
	if status, body := get(t, http.DefaultClient, closed.URL, nil); status != http.StatusBadGateway || !strings.Contains(body, "Nothing answered on port 9 ") {
		t.Errorf("closed port: %d %q", status, body)
	}
	// A server that is not HTTP: a 502 page that says so.
	if _, err := ws.Start(ctx, []string{"/root/webapp", "-banner", ":9400"}, sdk.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	banner, err := ws.Expose(ctx, 9400, sdk.ExposeOptions{Public: true})
	if err != nil {
		t.Fatal(err)
	}
	awaitRouted(t, banner.URL)
	eventually(t, 10*time.Second, "the banner server's 502 page", func() (string, error) {
		_, body := get(t, http.DefaultClient, banner.URL, nil)
		return body, nil
	}, func(body string) bool {
		return strings.Contains(body, "port 9400") && strings.Contains(body, "gave no HTTP response") && strings.Contains(body, "SSH-2.0-webapp")
	})

	// Refused calls store nothing.
	admin := d.adminToken()
	exposures := d.exposures(admin)
	stopped := d.create(small())
	d.await(stopped.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	mustUnary(t, d.client.StopWorkspace, &ctrlv1.StopWorkspaceRequest{Command: cmd(), WorkspaceId: stopped.WorkspaceId})
	d.await(stopped.WorkspaceId, ctrlv1.WorkspaceState_WORKSPACE_STATE_STOPPED)
	adminClient := adminv1connect.NewAdminServiceClient(http.DefaultClient, d.url, connect.WithInterceptors(bearer.Token(admin)))
	project := mustUnary(t, adminClient.CreateProject, &adminv1.CreateProjectRequest{Name: "other"}).Project
	other := mustUnary(t, adminClient.CreateToken, &adminv1.CreateTokenRequest{ProjectId: project.ProjectId, Role: adminv1.Role_ROLE_EDITOR}).Secret
	db := filepath.Join(d.home, "kibotos.db")
	keep := func(snap map[string][]string) map[string][]string {
		return map[string][]string{"exposures": snap["exposures"], "commands": snap["commands"]}
	}
	before := keep(ctrltest.SnapshotSQLite(t, db))
	for _, c := range []struct {
		name   string
		client ctrlv1connect.ExposureServiceClient
		req    *ctrlv1.CreateExposureRequest
		code   connect.Code
	}{
		{"port 0", exposures, &ctrlv1.CreateExposureRequest{Command: cmd(), WorkspaceId: ws.ID()}, connect.CodeInvalidArgument},
		{"port 65536", exposures, &ctrlv1.CreateExposureRequest{Command: cmd(), WorkspaceId: ws.ID(), Port: 65536}, connect.CodeInvalidArgument},
		{"another project's workspace", d.exposures(other), &ctrlv1.CreateExposureRequest{Command: cmd(), WorkspaceId: ws.ID(), Port: 3000}, connect.CodeNotFound},
		{"a stopped workspace", exposures, &ctrlv1.CreateExposureRequest{Command: cmd(), WorkspaceId: stopped.WorkspaceId, Port: 3000}, connect.CodeFailedPrecondition},
	} {
		if _, err := c.client.CreateExposure(ctx, connect.NewRequest(c.req)); connect.CodeOf(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
	}
	if after := keep(ctrltest.SnapshotSQLite(t, db)); !reflect.DeepEqual(before, after) {
		t.Errorf("refused CreateExposure calls stored something:\nbefore %v\nafter  %v", before, after)
	}
	if _, err := d.exposures(other).RevokeExposure(ctx, connect.NewRequest(&ctrlv1.RevokeExposureRequest{Command: cmd(), ExposureId: x.ID})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("revoke by another project: %v", err)
	}

	// Revoked: the URL stops working (401 or 404) within a second; the
	// generous deadline only bounds a broken run.
	if err := client.RevokeExposure(ctx, x.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the revoked exposure to stop answering", func() (int, error) {
		status, _ := get(t, http.DefaultClient, x.URL+"request", bearerHeader(x.Token))
		return status, nil
	}, func(status int) bool { return status == http.StatusNotFound || status == http.StatusUnauthorized })

	// A stop ends the exposures but the persistent one, which the next
	// start brings back.
	if _, err := client.StopWorkspace(ctx, ws.ID(), sdk.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	if status, _ := get(t, http.DefaultClient, kept.URL+"request", nil); status != http.StatusNotFound {
		t.Errorf("a stopped workspace's exposure answers %d", status)
	}
	list, err := ws.Exposures(ctx)
	if err != nil || len(list) != 1 || list[0].ExposureId != kept.ID {
		t.Errorf("after the stop: %v, %v; want only %s", list, err, kept.ID)
	}
	ws, err = client.StartWorkspace(ctx, ws.ID())
	if err != nil {
		t.Fatal(err)
	}
	runWebapp(t, ws, 8081)
	eventually(t, 10*time.Second, "the persistent exposure to answer again", func() (int, error) {
		status, _ := get(t, http.DefaultClient, kept.URL+"request", nil)
		return status, nil
	}, func(status int) bool { return status == http.StatusOK })
	if status, _ := get(t, http.DefaultClient, closed.URL, nil); status != http.StatusNotFound {
		t.Errorf("a non-persistent exposure after stop and start: %d", status)
	}
}

// TestExposureByHostName reaches a guest port at
// <port>-<workspace>.<domain> on a deployment with an exposure domain;
// the API stays where it was.
func TestExposureByHostName(t *testing.T) {
	d := upWith(t, t.TempDir(), daemon.Options{ExposureDomain: "apps.example.test"})
	defer d.stop()
	ctx := context.Background()
	ws, x := d.exposedWebapp(t, 8080)
	port := d.url[strings.LastIndexByte(d.url, ':')+1:]
	name := exposureabi.HostLabel(8080, ws.ID()) + ".apps.example.test:" + port
	if x.URL != "http://"+name+"/" {
		t.Fatalf("url %q, want http://%s/", x.URL, name)
	}
	var (
		resp *http.Response
		body []byte
		err  error
	)
	eventually(t, 10*time.Second, "the host to route "+name, func() (int, error) {
		req, _ := http.NewRequest(http.MethodGet, d.url+"/request", nil)
		req.Host = name
		req.Header = bearerHeader(x.Token)
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, err
	}, func(status int) bool { return status != http.StatusNotFound })
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"uri":"/request"`) || !strings.Contains(string(body), name) {
		t.Errorf("by host name: %d %s", resp.StatusCode, body)
	}
	if _, err := ws.Stat(ctx, "/"); err != nil {
		t.Errorf("the data plane beside host-named exposures: %v", err)
	}
	// The path URL would share the listener's origin: not served.
	if status, body := get(t, http.DefaultClient, d.url+"/x/"+x.ID+"/request?probe=path-url", bearerHeader(x.Token)); status != http.StatusNotFound || !strings.Contains(body, "host names") {
		t.Errorf("the path URL under a domain: %d %q", status, body)
	}
	if strings.Contains(guestRequests(t, ws), "path-url") {
		t.Error("the guest saw a request by path URL")
	}
}

// TestExposurePublicURL pins how the public URL that session endpoints
// and exposure URLs are built from is derived.
func TestExposurePublicURL(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		configured, listen, want string
		tls                      bool
	}{
		{"", "127.0.0.1:8870", "https://127.0.0.1:8870", true},
		{"", "0.0.0.0:8870", "https://" + host + ":8870", true},
		{"", "127.0.0.1:8870", "http://127.0.0.1:8870", false},
		{"", "[::1]:8870", "http://[::1]:8870", false},
		{"", "0.0.0.0:8870", "http://" + host + ":8870", false},
		{"", "[::]:8870", "http://" + host + ":8870", false},
		{"https://kibotos.example.com/", "0.0.0.0:8870", "https://kibotos.example.com", false},
		{"http://10.0.0.5:9000/base", "[::]:8870", "http://10.0.0.5:9000/base", false},
	} {
		got, err := daemon.PublicURL(c.configured, tcpAddr(c.listen), c.tls)
		if err != nil || got != c.want {
			t.Errorf("PublicURL(%q, %s) = %q, %v; want %q", c.configured, c.listen, got, err, c.want)
		}
	}
	for _, bad := range []string{"kibotos.example.com", "ftp://x", "http://", "http://u:p@x", "http://x/?a=1", "http://x/#f"} {
		if got, err := daemon.PublicURL(bad, tcpAddr("127.0.0.1:1"), false); err == nil {
			t.Errorf("PublicURL(%q) = %q", bad, got)
		}
	}
}

type tcpAddr string

func (a tcpAddr) Network() string { return "tcp" }
func (a tcpAddr) String() string  { return string(a) }
