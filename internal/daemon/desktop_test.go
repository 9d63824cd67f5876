package daemon_test

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/daemon"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

// desktopCache builds the desktop template's image in the machine's cache,
// which takes minutes the first time (mmdebstrap fetches Debian's
// packages) and nothing later, and returns the cache. It skips the test,
// saying why, when the image cannot be built here.
func desktopCache(t *testing.T) string {
	t.Helper()
	hosttest.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var log testutil.SyncBuffer
	if c := os.Getenv("TMPCACHE"); c != "" {
		return c
	}
	if _, err := imagestore.BuildDesktopImage(ctx, imagestore.DesktopCacheDir, &log); err != nil {
		out := log.String()
		if len(out) > 2000 {
			out = out[len(out)-2000:]
		}
		t.Skipf("the desktop template's image cannot be built on this machine: %v\n%s", err, out)
	}
	return imagestore.DesktopCacheDir
}

// upDesktop starts a deployment with the desktop template and waits until
// the template is there (its import takes seconds).
func upDesktop(t *testing.T) *deployment {
	t.Helper()
	d := upWith(t, t.TempDir(), daemon.Options{DesktopCache: desktopCache(t)})
	token, err := os.ReadFile(filepath.Join(d.home, daemon.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	templates := ctrlv1connect.NewTemplateServiceClient(httpClient(), d.url, connect.WithInterceptors(bearer.Token(strings.TrimSpace(string(token)))))
	tmpl := eventually(t, 5*time.Minute, "the template desktop", func() (*ctrlv1.Template, error) {
		resp, err := templates.GetTemplate(context.Background(), connect.NewRequest(&ctrlv1.GetTemplateRequest{TemplateId: "desktop"}))
		if connect.CodeOf(err) == connect.CodeNotFound {
			return nil, nil
		}
		return resp.Msg.GetTemplate(), err
	}, func(t *ctrlv1.Template) bool { return t != nil })
	rev := tmpl.GetRevisions()[0]
	if d := rev.GetDisplay(); d.GetWidth() != 1280 || d.GetHeight() != 800 || rev.GetSource() != "builtin" {
		t.Fatalf("desktop's revision %v, want a built-in one with a 1280x800 display", rev)
	}
	return d
}

// TestDesktop runs a desktop workspace: its screen shows the desktop, a
// key binding opens a terminal that input types a command into, a click
// moves the focus to another window, and a browser shows a loopback page.
// A workspace without a display refuses both services.
func TestDesktop(t *testing.T) {
	d := upDesktop(t)
	defer d.stop()
	ctx := context.Background()
	client := d.sdkClient()

	// screen and input need a template with a display.
	_, err := client.CreateWorkspace(ctx, sdk.CreateOptions{MemoryBytes: 128 << 20, Capabilities: []string{"screen", "input"}})
	if f, _ := sdk.FailureOf(err); connect.CodeOf(err) != connect.CodeFailedPrecondition || f.GetReason() != ctrlv1.FailureReason_FAILURE_REASON_CAPABILITY_UNAVAILABLE {
		t.Errorf("screen and input on base: %v, want CAPABILITY_UNAVAILABLE", err)
	}
	ws, err := client.CreateWorkspace(ctx, sdk.CreateOptions{Template: "desktop", MemoryBytes: 1536 << 20, Capabilities: []string{"screen", "input"}})
	if err != nil {
		t.Fatal(err)
	}
	if p := ws.Info().GetSpec().GetNetworkPolicy(); p.GetMode() != ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_DENY_ALL {
		t.Fatalf("the desktop workspace's policy is %v, want the default DENY_ALL", p)
	}

	// The display and the window manager run, started by the guest agent.
	procs, err := ws.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tags := map[string]bool{}
	for _, p := range procs {
		tags[p.GetTag()] = p.GetExited() == nil
	}
	if !tags["display"] || !tags["window-manager"] {
		t.Fatalf("guest processes %v, want the display and the window manager running", procs)
	}

	// The desktop: the session paints the background and starts the panel
	// (the window manager has started when the workspace is AVAILABLE,
	// what it starts may take a moment more).
	desktop := awaitScreen(t, ws, "the desktop", func(img image.Image) bool { return distinctColors(img, img.Bounds()) > 2 })
	if b := desktop.Bounds(); b.Dx() != 1280 || b.Dy() != 800 {
		t.Fatalf("the capture is %v, want 1280x800", b)
	}

	// Ctrl+Alt+T opens a terminal in the middle of the screen, which takes
	// the focus.
	if err := ws.Input(ctx, sdk.Chord("Control_L", "Alt_L", "t")...); err != nil {
		t.Fatal(err)
	}
	awaitScreen(t, ws, "a terminal", func(img image.Image) bool { return differs(img, desktop, image.Rect(440, 260, 840, 540)) })
	if err := ws.Input(ctx, sdk.Type("echo marker > /tmp/m"), sdk.Key("Return")); err != nil {
		t.Fatal(err)
	}
	awaitFile(t, ws, "/tmp/m", "marker\n")

	// Two more terminals, started with the DISPLAY the guest agent sets: A
	// in the top left corner in /tmp/a, then B in the bottom right corner
	// in /tmp/b, which takes the focus.
	terminal := func(tag, geometry, dir string, region image.Rectangle) {
		before := capture(t, ws)
		if _, err := ws.Start(ctx, []string{"xterm", "-geometry", geometry, "-e", "sh", "-c", "mkdir " + dir + " && cd " + dir + " && exec bash"},
			sdk.ExecOptions{Tag: tag}); err != nil {
			t.Fatal(err)
		}
		awaitScreen(t, ws, tag+" to open", func(img image.Image) bool { return differs(img, before, region) })
		awaitFile(t, ws, dir, "")
	}
	terminal("terminal-a", "40x10+20+20", "/tmp/a", image.Rect(20, 20, 260, 160))
	terminal("terminal-b", "40x10+900+500", "/tmp/b", image.Rect(900, 500, 1140, 640))
	if err := ws.Input(ctx, sdk.Type("touch typed-here\n")); err != nil {
		t.Fatal(err)
	}
	awaitFile(t, ws, "/tmp/b/typed-here", "")

	// A click on A gives it the focus: the screen changes (the window
	// manager draws A's frame as focused), and what is typed next runs
	// there. Keys typed before the window manager has handled the click
	// would still reach B, so the typing waits for the redraw.
	beforeClick := capture(t, ws)
	if err := ws.Input(ctx, sdk.MoveTo(120, 100), sdk.Button(1)); err != nil {
		t.Fatal(err)
	}
	awaitScreen(t, ws, "the focus to move to A", func(img image.Image) bool {
		return differs(img, beforeClick, image.Rect(0, 0, 1280, 800))
	})
	if err := ws.Input(ctx, sdk.Type("touch typed-here\n")); err != nil {
		t.Fatal(err)
	}
	awaitFile(t, ws, "/tmp/a/typed-here", "")

	// The browser draws a page from the guest's own files, its own traffic
	// off (the workspace's policy refuses all of it anyway).
	if err := ws.WriteFile(ctx, "/tmp/page.html", []byte(`<html><body style="margin:0;background:#00ff00"></body></html>`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Start(ctx, []string{"chromium", "--no-first-run", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--disable-default-apps", "--no-default-browser-check", "--disable-breakpad", "--disable-features=Translate,MediaRouter",
		"--user-data-dir=/tmp/chromium", "--window-position=100,100", "--window-size=600,400", "--app=file:///tmp/page.html"},
		sdk.ExecOptions{Tag: "browser"}); err != nil {
		t.Fatal(err)
	}
	awaitScreen(t, ws, "the browser to draw the page", func(img image.Image) bool {
		return pixel(img, 400, 300) == 0x00ff00
	})
}

// TestScreenAndInputWithoutDisplay: the workspace of a template without a
// display refuses both services, saying so.
func TestScreenAndInputWithoutDisplay(t *testing.T) {
	d := up(t, t.TempDir())
	defer d.stop()
	ws := d.sdkWorkspace(128<<20, 64<<20)
	_, err := ws.Screenshot(context.Background())
	wantFailure(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureStage_FAILURE_STAGE_CAPTURING_SCREEN, "carries no display")
	err = ws.Input(context.Background(), sdk.Key("Return"))
	wantFailure(t, err, connect.CodeFailedPrecondition, ctrlv1.FailureStage_FAILURE_STAGE_DELIVERING_INPUT, "carries no display")
}

func wantFailure(t *testing.T, err error, code connect.Code, stage ctrlv1.FailureStage, says string) {
	t.Helper()
	f, _ := sdk.FailureOf(err)
	if connect.CodeOf(err) != code || f.GetStage() != stage || !strings.Contains(err.Error(), says) {
		t.Errorf("got %v (stage %v), want %v with stage %v saying %q", err, f.GetStage(), code, stage, says)
	}
}

// capture takes a screenshot and decodes it.
func capture(t *testing.T, ws *sdk.Workspace) image.Image {
	t.Helper()
	shot, err := ws.Screenshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot.GetPng()))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != int(shot.GetWidth()) || b.Dy() != int(shot.GetHeight()) {
		t.Fatalf("the PNG is %v, the response says %dx%d", b, shot.GetWidth(), shot.GetHeight())
	}
	return img
}

// awaitScreen captures until done holds of a capture and returns it.
func awaitScreen(t *testing.T, ws *sdk.Workspace, what string, done func(image.Image) bool) image.Image {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if img := capture(t, ws); done(img) {
			return img
		}
	}
	t.Fatalf("no capture showed %s within a minute", what)
	return nil
}

// awaitFile waits until the guest has path (a file or a directory), with
// the content want unless want is empty.
func awaitFile(t *testing.T, ws *sdk.Workspace, path, want string) {
	t.Helper()
	eventually(t, 30*time.Second, path, func() (bool, error) {
		if want == "" {
			_, err := ws.Stat(context.Background(), path)
			if connect.CodeOf(err) == connect.CodeNotFound {
				return false, nil
			}
			return err == nil, err
		}
		b, err := ws.ReadFile(context.Background(), path)
		if connect.CodeOf(err) == connect.CodeNotFound {
			return false, nil
		}
		return string(b) == want, err
	}, func(ok bool) bool { return ok })
}

func pixel(img image.Image, x, y int) uint32 {
	r, g, b, _ := img.At(x, y).RGBA()
	return r>>8<<16 | g>>8<<8 | b>>8
}

func distinctColors(img image.Image, r image.Rectangle) int {
	seen := map[uint32]bool{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			seen[pixel(img, x, y)] = true
		}
	}
	return len(seen)
}

// differs reports whether a and b differ in r.
func differs(a, b image.Image, r image.Rectangle) bool {
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if pixel(a, x, y) != pixel(b, x, y) {
				return true
			}
		}
	}
	return false
}
