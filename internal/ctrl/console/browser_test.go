package console_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/uuid"

	adminv1 "github.com/kibotos/kibotos/gen/kibotos/admin/v1"
	"github.com/kibotos/kibotos/gen/kibotos/admin/v1/adminv1connect"
	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/internal/ctrl/console"
	"github.com/kibotos/kibotos/internal/daemon/uptest"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/testutil"
	"github.com/kibotos/kibotos/sdk"
	"github.com/kibotos/kibotos/sdk/bearer"
)

func TestMain(m *testing.M) { os.Exit(uptest.Main(m)) }

// ScreenshotsEnv names the directory the browser test saves its
// screenshots in; unset, they go to the test's temporary directory.
const ScreenshotsEnv = "KIBOTOS_CONSOLE_SCREENSHOTS"

// page drives headless Chromium against the console of a deployment.
type page struct {
	t    *testing.T
	ctx  context.Context
	shot string // screenshot directory
	n    int
}

// requireBundle skips a test of the console's pages when its bundle is
// not built.
func requireBundle(t *testing.T) {
	t.Helper()
	if !console.New().Built() {
		t.Skip("the console's bundle is not built: run make build (npm ci and the bundle in console/)")
	}
}

func newPage(t *testing.T) *page {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("needs chromium (Debian package chromium; scripts/install-deps installs it)")
	}
	dir := os.Getenv(ScreenshotsEnv)
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	alloc, cancel := chromedp.NewExecAllocator(context.Background(), chromedp.ExecPath(chromium),
		// Its singleton socket's directory, which a browser that is
		// killed leaves, goes in the test's own.
		chromedp.Env("TMPDIR="+t.TempDir()),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-first-run", true), chromedp.Flag("disable-sync", true), chromedp.Flag("disable-default-apps", true),
		chromedp.WindowSize(1280, 900))
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	ctx, cancel = context.WithTimeout(ctx, 5*time.Minute)
	t.Cleanup(cancel)
	return &page{t: t, ctx: ctx, shot: dir}
}

func (b *page) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatal(err)
	}
}

// wait polls a JavaScript expression until it is true.
func (b *page) wait(what, expr string) {
	b.t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(3*time.Minute))); err != nil {
		b.screenshot("failed")
		page, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerHTML`))
		b.t.Fatalf("waiting for %s (%s): %v; the page:\n%s", what, expr, err, page)
	}
}

// text returns the text of the first element matching a CSS selector.
func (b *page) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q)?.textContent ?? ""`, sel)))
	if err != nil {
		b.t.Fatal(err)
	}
	return s
}

// screenshot saves the page as TEST-NN-name.png.
func (b *page) screenshot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return
	}
	b.n++
	path := filepath.Join(b.shot, fmt.Sprintf("%s-%02d-%s.png", b.t.Name(), b.n, name))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", path)
}

// typeLine types text into the focused element as one insertion (as an
// input method does) and presses Enter as a raw key. chromedp's SendKeys
// sends each character as a key down and a separate char event, which a
// terminal reads as two presses.
func (b *page) typeLine(text string) {
	b.t.Helper()
	steps := []func() error{
		func() error {
			_, err := chromedp.Call(b.ctx, input.InsertText, input.InsertTextParams{Text: text})
			return err
		},
		func() error {
			_, err := chromedp.Call(b.ctx, input.DispatchKeyEvent, input.DispatchKeyEventParams{
				Type: input.DispatchKeyEventTypeRawKeyDown, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13})
			return err
		},
		func() error {
			_, err := chromedp.Call(b.ctx, input.DispatchKeyEvent, input.DispatchKeyEventParams{
				Type: input.DispatchKeyEventTypeKeyUp, Key: "Enter", Code: "Enter", WindowsVirtualKeyCode: 13, NativeVirtualKeyCode: 13})
			return err
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			b.t.Fatal(err)
		}
	}
}

func js(s string) string { return fmt.Sprintf("%q", s) }

// TestConsole uses the console as a person would, in headless Chromium
// against a real deployment: sign in, a refused and an accepted workspace,
// a shell that answers and survives a reload, an upload, network policy
// edits refused, stale and applied, and deletion. Every action is checked
// against the API.
func TestConsole(t *testing.T) {
	requireBundle(t)
	d := uptest.Shared(t)
	token := d.Project(t)
	b := newPage(t)
	ctx := t.Context()
	wss := ctrlv1connect.NewWorkspaceServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(token)))
	list := func() []*ctrlv1.Workspace {
		t.Helper()
		r, err := wss.ListWorkspaces(ctx, connect.NewRequest(&ctrlv1.ListWorkspacesRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetWorkspaces()
	}

	// Sign in: the token goes to session storage, never the URL.
	b.do(chromedp.Navigate(d.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.screenshot("sign-in")
	b.do(chromedp.SetValue(chromedp.CSS("#token"), "not-a-token"), chromedp.Click(chromedp.CSS(`form.signin button[type=submit]`)))
	b.wait("a refused token", `document.getElementById("token-error").textContent.includes("unauthenticated")`)
	b.do(chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS(`form.signin button[type=submit]`)))
	b.wait("the role", `document.getElementById("who-role")?.textContent === "role admin"`)
	if p := b.text("#who-project"); !strings.HasPrefix(p, "project t-") {
		t.Errorf("the project shown is %q", p)
	}
	b.wait("the templates", `document.querySelector("#ws-template option[value=base]") !== null`)
	b.screenshot("workspaces")

	// Memory that is not a whole MiB: the server's error next to the
	// field, nothing stored.
	b.do(chromedp.SetValue(chromedp.CSS("#ws-memory"), "256.5"), chromedp.Click(chromedp.CSS(`form.create button[type=submit]`)))
	b.wait("the memory error", `document.getElementById("ws-memory-error").textContent.includes("whole number of MiB")`)
	if e := b.text("#ws-memory-error"); !strings.HasPrefix(e, "invalid_argument: spec.resources.memory_bytes") {
		t.Errorf("the memory error reads %q", e)
	}
	b.screenshot("create-refused")
	if n := len(list()); n != 0 {
		t.Fatalf("a refused create stored %d workspaces", n)
	}

	// A new volume at a relative path: refused next to the path.
	b.do(chromedp.SetValue(chromedp.CSS("#ws-memory"), "256"), chromedp.SetValue(chromedp.CSS("#ws-volume"), "new"),
		chromedp.SetValue(chromedp.CSS("#ws-mount"), "data"), chromedp.Click(chromedp.CSS(`form.create button[type=submit]`)))
	b.wait("the mount path error", `document.getElementById("ws-mount-error").textContent.startsWith("invalid_argument: volume.mount_path")`)
	if n := len(list()); n != 0 {
		t.Fatalf("a refused create stored %d workspaces", n)
	}
	if _, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`document.getElementById("ws-volume").value = "none"; document.getElementById("ws-mount").value = ""; true`)); err != nil {
		t.Fatal(err)
	}

	// A workspace, AVAILABLE in the live list.
	b.do(chromedp.SetValue(chromedp.CSS("#ws-memory"), "256"), chromedp.SetValue(chromedp.CSS("#ws-labels"), "made-by=console"),
		chromedp.Click(chromedp.CSS(`form.create button[type=submit]`)))
	b.wait("the workspace in the list", `document.querySelector("table.list tbody tr") !== null`)
	wss0 := list()
	if len(wss0) != 1 || wss0[0].GetLabels()["made-by"] != "console" || wss0[0].GetSpec().GetResources().GetMemoryBytes() != 256<<20 {
		t.Fatalf("workspaces after the create: %v", wss0)
	}
	id := wss0[0].GetWorkspaceId()
	row := fmt.Sprintf(`document.querySelector('tr[data-id=%s]')`, js(id))
	b.wait("AVAILABLE", row+`?.children[1].textContent === "AVAILABLE"`)
	b.screenshot("workspace-available")

	// The overview's changes: labels, and a memory that is not a whole MiB
	// refused next to its field.
	b.do(chromedp.Navigate(d.URL+"/#/workspaces/"+id), chromedp.WaitVisible(chromedp.CSS("#edit-labels")))
	b.wait("the labels in the form", `document.getElementById("edit-labels").value === "made-by=console"`)
	b.do(chromedp.SetValue(chromedp.CSS("#edit-labels"), "made-by=console, tier=2"), chromedp.Click(chromedp.CSS(`form[aria-label="Set labels"] button`)))
	b.wait("the new labels", `[...document.querySelectorAll(".facts dd")].some(dd => dd.textContent === "made-by=console, tier=2")`)
	b.do(chromedp.SetValue(chromedp.CSS("#edit-memory"), "300.5"), chromedp.Click(chromedp.CSS(`form[aria-label="Set memory"] button`)))
	b.wait("the memory error", `document.getElementById("edit-memory-error").textContent.includes("whole number of MiB")`)
	b.screenshot("overview")
	w := list()[0]
	if w.GetLabels()["tier"] != "2" || w.GetSpec().GetResources().GetMemoryBytes() != 256<<20 {
		t.Fatalf("after the overview's changes: labels %v, memory %d", w.GetLabels(), w.GetSpec().GetResources().GetMemoryBytes())
	}
	// An edit of what the field showed is refused once another client
	// changed the labels meanwhile, and theirs stay.
	b.do(chromedp.SetValue(chromedp.CSS("#edit-labels"), "mine=1"))
	if _, err := wss.UpdateWorkspaceLabels(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceLabelsRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: "labels-from-elsewhere"}, WorkspaceId: id,
		ExpectedLabelsRevision: w.GetLabelsRevision(), Labels: map[string]string{"owner": "bob"}})); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Click(chromedp.CSS(`form[aria-label="Set labels"] button`)))
	b.wait("the conflict", `document.getElementById("edit-labels-error").textContent.startsWith("aborted")`)
	if got := list()[0].GetLabels(); got["owner"] != "bob" || got["mine"] != "" {
		t.Fatalf("labels after a stale edit: %v; want the other client's", got)
	}

	// The terminal: echo hi, and hi comes back; a reload in a smaller
	// window attaches to the same shell, whose output the guest replays,
	// and the shell, told of its new size, keeps it on the screen. Blank
	// lines follow hi: at each new size ash redraws its prompt two lines
	// up and clears what is below, and the replay holds every redraw, so
	// output right above the prompt may be cleared by the time it settles.
	rows := `[...document.querySelectorAll(".xterm-rows > div")].map(r => r.textContent.trim())`
	b.do(chromedp.Navigate(d.URL + "/#/workspaces/" + id + "/terminal"))
	b.wait("the shell", `document.getElementById("term-status")?.textContent.startsWith("shell pid")`)
	b.do(chromedp.Click(chromedp.CSS(".xterm")))
	b.typeLine(`echo hi; printf '\n\n\n\n\n\n\n\n'`)
	b.wait("hi in the terminal", rows+`.includes("hi")`)
	b.screenshot("terminal")
	b.do(chromedp.EmulateViewport(1000, 700), chromedp.Reload())
	t.Cleanup(func() {
		if t.Failed() {
			logShells(t, d.URL, token, id)
		}
	})
	b.wait("the shell again", `document.getElementById("term-status")?.textContent.startsWith("attached to the running shell")`)
	b.wait("hi replayed", rows+`.includes("hi")`)
	if loc, err := chromedp.Run(b.ctx, chromedp.Location()); err != nil || strings.Contains(loc, token) {
		t.Errorf("the URL is %q (%v)", loc, err)
	}

	// Files: an upload, listed.
	upload := filepath.Join(t.TempDir(), "hello-console.txt")
	if err := os.WriteFile(upload, []byte(strings.Repeat("hello from the console\n", 100000)), 0o644); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Navigate(d.URL+"/#/workspaces/"+id+"/files"), chromedp.WaitVisible(chromedp.CSS("#files-dir")))
	b.wait("the directory", `document.querySelector("table[aria-label=Files] tbody") !== null`)
	b.do(chromedp.SetUploadFiles(chromedp.CSS("#files-upload"), []string{upload}))
	b.wait("the uploaded file listed", `[...document.querySelectorAll("table[aria-label=Files] tbody td:first-child")].some(td => td.textContent === "hello-console.txt")`)
	b.wait("the upload done", `document.querySelector(".progress li")?.textContent.includes("uploaded")`)
	b.screenshot("files")
	want, _ := os.ReadFile(upload)
	ws, err := sdk.New(d.URL, token).Workspace(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ws.ReadFile(ctx, "/tmp/hello-console.txt"); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the uploaded file holds %d bytes (%v), want the %d sent", len(got), err, len(want))
	}
	// Download, rename, delete.
	downloads := t.TempDir()
	if _, err := chromedp.CallBrowser(b.ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: downloads}); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Download hello-console.txt"]`)))
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := os.ReadFile(filepath.Join(downloads, "hello-console.txt"))
		if err == nil && bytes.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the download holds %d bytes (%v), want %d", len(got), err, len(want))
		}
		time.Sleep(100 * time.Millisecond)
	}
	names := `[...document.querySelectorAll("table[aria-label=Files] tbody td:first-child")].map(td => td.textContent)`
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Rename hello-console.txt"]`)),
		chromedp.SetValue(chromedp.CSS("form.inline input"), "renamed.txt"),
		chromedp.Click(chromedp.CSS(`form.inline button[type=submit]`)))
	b.wait("the renamed file", names+`.includes("renamed.txt") && !`+names+`.includes("hello-console.txt")`)
	// A rename onto a name that is taken asks first.
	if _, err := ws.Exec(ctx, []string{"sh", "-c", "echo keep > /tmp/taken.txt"}, sdk.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Rename renamed.txt"]`)),
		chromedp.SetValue(chromedp.CSS("form.inline input"), "taken.txt"),
		chromedp.Click(chromedp.CSS(`form.inline button[type=submit]`)))
	b.wait("the question", `document.querySelector("form.inline .field-error")?.textContent.includes("press Save again")`)
	if got, err := ws.ReadFile(ctx, "/tmp/taken.txt"); err != nil || string(got) != "keep\n" {
		t.Fatalf("a rename onto a taken name replaced it at once: %q, %v", got, err)
	}
	// Save again: the rename replaces it.
	b.do(chromedp.Click(chromedp.CSS(`form.inline button[type=submit]`)))
	b.wait("the rename again", names+`.includes("taken.txt") && !`+names+`.includes("renamed.txt")`)
	if got, err := ws.ReadFile(ctx, "/tmp/taken.txt"); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after the confirmed rename, taken.txt holds %d bytes (%v), want the renamed file's %d", len(got), err, len(want))
	}
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Rename taken.txt"]`)),
		chromedp.SetValue(chromedp.CSS("form.inline input"), "renamed.txt"),
		chromedp.Click(chromedp.CSS(`form.inline button[type=submit]`)))
	b.wait("the renamed file back", names+`.includes("renamed.txt") && !`+names+`.includes("taken.txt")`)
	// The rows act on the directory the table lists, whatever the field
	// says; a delete takes a second press.
	b.do(chromedp.SetValue(chromedp.CSS("#files-dir"), "/root"),
		chromedp.Click(chromedp.CSS(`button[aria-label="Delete /tmp/renamed.txt"]`)))
	if _, err := ws.ReadFile(ctx, "/tmp/renamed.txt"); err != nil {
		t.Fatalf("one press of Delete deleted the file: %v", err)
	}
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Confirm delete /tmp/renamed.txt"]`)))
	b.wait("the file gone", `!`+names+`.includes("renamed.txt")`)
	if _, err := ws.ReadFile(ctx, "/tmp/renamed.txt"); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("reading the deleted file: %v", err)
	}

	// Network: an invalid CIDR is refused next to its field and stores
	// nothing; an edit on a stale revision shows the conflict and the
	// current policy; an edit on the current one is applied.
	policy := func() (*ctrlv1.NetworkPolicy, uint64) {
		t.Helper()
		r, err := wss.GetWorkspace(ctx, connect.NewRequest(&ctrlv1.GetWorkspaceRequest{WorkspaceId: id}))
		if err != nil {
			t.Fatal(err)
		}
		w := r.Msg.GetWorkspace()
		return w.GetSpec().GetNetworkPolicy(), w.GetNetworkPolicyStatus().GetAppliedRevision()
	}
	before, _ := policy()
	b.do(chromedp.Navigate(d.URL+"/#/workspaces/"+id+"/network"), chromedp.WaitVisible(chromedp.CSS("#net-mode")))
	b.wait("the form", `document.querySelector("form.edit").dataset.revision === `+js(fmt.Sprint(before.GetRevision())))
	public := fmt.Sprint(int32(ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET))
	b.do(chromedp.SetValue(chromedp.CSS("#net-mode"), public), chromedp.SetValue(chromedp.CSS("#net-allow"), "203.0.113.0/33"),
		chromedp.Click(chromedp.CSS(`form.edit button[type=submit]`)))
	b.wait("the CIDR error", `document.getElementById("net-allow-error").textContent.startsWith("invalid_argument: network_policy.allow[0]")`)
	b.screenshot("network-refused")
	if p, _ := policy(); p.GetRevision() != before.GetRevision() || len(p.GetAllow()) != 0 {
		t.Fatalf("a refused edit changed the policy: %v", p)
	}
	// Another client changes the policy; the page's edit is now stale.
	other, err := wss.UpdateWorkspaceNetworkPolicy(ctx, connect.NewRequest(&ctrlv1.UpdateWorkspaceNetworkPolicyRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, WorkspaceId: id, ExpectedRevision: before.GetRevision(),
		Policy: &ctrlv1.NetworkPolicy{Mode: ctrlv1.NetworkPolicyMode_NETWORK_POLICY_MODE_PUBLIC_INTERNET, Deny: []string{"192.0.2.0/24"}}}))
	if err != nil {
		t.Fatal(err)
	}
	current := other.Msg.GetWorkspace().GetSpec().GetNetworkPolicy()
	b.do(chromedp.SetValue(chromedp.CSS("#net-allow"), "203.0.113.0/24"), chromedp.Click(chromedp.CSS(`form.edit button[type=submit]`)))
	b.wait("the conflict", `document.getElementById("net-form-error").textContent.startsWith("aborted:")`)
	if c := b.text("#net-current"); !strings.Contains(c, fmt.Sprintf("revision %d: PUBLIC_INTERNET", current.GetRevision())) || !strings.Contains(c, "deny 192.0.2.0/24") {
		t.Errorf("the current policy shown is %q", c)
	}
	b.screenshot("network-conflict")
	if p, _ := policy(); p.GetRevision() != current.GetRevision() || len(p.GetAllow()) != 0 {
		t.Fatalf("a stale edit changed the policy: %v", p)
	}
	b.do(chromedp.Click(chromedp.CSS(`#net-conflict button`)))
	b.wait("the current policy in the form", `document.querySelector("form.edit").dataset.revision === `+js(fmt.Sprint(current.GetRevision())))
	b.do(chromedp.SetValue(chromedp.CSS("#net-allow"), "203.0.113.0/24"), chromedp.Click(chromedp.CSS(`form.edit button[type=submit]`)))
	b.wait("the new revision in the form", `document.querySelector("form.edit").dataset.revision !== `+js(fmt.Sprint(current.GetRevision())))
	after, _ := policy()
	if after.GetRevision() <= current.GetRevision() || strings.Join(after.GetAllow(), ",") != "203.0.113.0/24" || strings.Join(after.GetDeny(), ",") != "192.0.2.0/24" {
		t.Fatalf("the policy after the edit: %v", after)
	}
	b.wait("the applied revision", fmt.Sprintf(`document.querySelector('[data-fact="Applied revision"]')?.textContent === "%d"`, after.GetRevision()))
	if _, applied := policy(); applied != after.GetRevision() {
		t.Errorf("the API says applied revision %d, want %d", applied, after.GetRevision())
	}
	b.screenshot("network-applied")

	// Delete, confirmed, from the workspace's page.
	b.do(chromedp.Navigate(d.URL+"/#/workspaces/"+id), chromedp.WaitVisible(chromedp.CSS("#ws-state")))
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Delete ` + id + `"]`)))
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Confirm delete ` + id + `"]`)))
	b.wait("DELETED", `document.getElementById("ws-state").textContent === "DELETED"`)
	b.screenshot("deleted")
	b.do(chromedp.Navigate(d.URL+"/#/resources"), chromedp.WaitVisible(chromedp.CSS("table[aria-label=Tokens]")))
	b.screenshot("resources")
	// A phone's width.
	b.do(chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile), chromedp.Navigate(d.URL+"/#/workspaces"),
		chromedp.WaitVisible(chromedp.CSS("form.create")))
	b.screenshot("workspaces-phone")
	b.do(chromedp.Click(chromedp.CSS(`#who button`)), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.wait("the token forgotten", `sessionStorage.getItem("kibotos.token") === null`)
}

// TestConsoleTemplateImport imports an image archive as a template's
// revision from the console's resources page, through the client stream
// the page sends with XMLHttpRequest.
func TestConsoleTemplateImport(t *testing.T) {
	requireBundle(t)
	d := uptest.Shared(t)
	token := d.Project(t)
	base, err := imagestore.BuiltinImage(imagestore.DefaultBusybox)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(archive, name.MustParseReference("example.com/console:1"), base); err != nil {
		t.Fatal(err)
	}
	b := newPage(t)
	b.do(chromedp.Navigate(d.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS(`form.signin button[type=submit]`)))
	b.wait("the role", `document.getElementById("who-role")?.textContent === "role admin"`)
	templates := ctrlv1connect.NewTemplateServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(token)))

	// An archive that is not one: refused, and the template the import
	// made for it is gone again.
	junk := filepath.Join(t.TempDir(), "junk.tar")
	if err := os.WriteFile(junk, []byte("not a tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Navigate(d.URL+"/#/resources"), chromedp.WaitVisible(chromedp.CSS("#tpl-id")),
		chromedp.SetValue(chromedp.CSS("#tpl-id"), "junk"), chromedp.SetUploadFiles(chromedp.CSS("#tpl-file"), []string{junk}),
		chromedp.Click(chromedp.CSS(`form[aria-label="Import a template revision"] button[type=submit]`)))
	b.wait("the import refused", `document.getElementById("tpl-file-error").textContent.startsWith("invalid_argument")`)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, err := templates.GetTemplate(t.Context(), connect.NewRequest(&ctrlv1.GetTemplateRequest{TemplateId: "junk"}))
		if connect.CodeOf(err) == connect.CodeNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the template of a refused import: %v; want it deleted", err)
		}
	}

	b.do(chromedp.SetValue(chromedp.CSS("#tpl-id"), "console-image"), chromedp.SetUploadFiles(chromedp.CSS("#tpl-file"), []string{archive}),
		chromedp.Click(chromedp.CSS(`form[aria-label="Import a template revision"] button[type=submit]`)))
	b.wait("the template listed", `[...document.querySelectorAll("table[aria-label=Templates] tbody td:first-child")].some(td => td.textContent === "console-image")`)
	b.screenshot("template-imported")
	r, err := templates.GetTemplate(t.Context(), connect.NewRequest(&ctrlv1.GetTemplateRequest{TemplateId: "console-image"}))
	if err != nil {
		t.Fatal(err)
	}
	if tpl := r.Msg.GetTemplate(); len(tpl.GetRevisions()) != 1 || tpl.GetDefaultRevision() == "" {
		t.Errorf("the imported template: %v", tpl)
	}
	if v, _ := chromedp.Run(b.ctx, chromedp.Evaluate[float64](`document.getElementById("tpl-progress").value`)); v <= 0 {
		t.Errorf("the progress bar reads %v", v)
	}
}

// signIn signs in with token and waits for the role the header shows.
func (b *page) signIn(url, token, role string) {
	b.t.Helper()
	b.do(chromedp.Navigate(url+"/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SetValue(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS(`form.signin button[type=submit]`)))
	b.wait("the role", `document.getElementById("who-role")?.textContent === `+js("role "+role))
}

// TestConsoleUpstreams creates and edits an Egress and a Resolver from the
// resources page: bad input refused next to its field with nothing
// stored, an edit on a stale revision shown as a conflict with the
// current spec and nothing changed, and edits stored as sent.
func TestConsoleUpstreams(t *testing.T) {
	requireBundle(t)
	d := uptest.Shared(t)
	token := d.Project(t)
	ctx := t.Context()
	egresses := ctrlv1connect.NewEgressServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(token)))
	resolvers := ctrlv1connect.NewResolverServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(token)))
	listEgresses := func() []*ctrlv1.Egress {
		t.Helper()
		r, err := egresses.ListEgresses(ctx, connect.NewRequest(&ctrlv1.ListEgressesRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetEgresses()
	}
	listResolvers := func() []*ctrlv1.Resolver {
		t.Helper()
		r, err := resolvers.ListResolvers(ctx, connect.NewRequest(&ctrlv1.ListResolversRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetResolvers()
	}
	b := newPage(t)
	b.signIn(d.URL, token, "admin")
	b.do(chromedp.Navigate(d.URL+"/#/resources"), chromedp.WaitVisible(chromedp.CSS("#eg-address")))
	b.wait("the egress list", `document.querySelector("table[aria-label=Egresses]") !== null`)
	submitEgress := chromedp.Click(chromedp.CSS(`form[aria-labelledby=eg-form-title] button[type=submit]`))
	submitResolver := chromedp.Click(chromedp.CSS(`form[aria-labelledby=rs-form-title] button[type=submit]`))

	// An Egress address without a port, then one in a special-purpose
	// range: each refused next to the address, nothing stored.
	b.do(chromedp.SetValue(chromedp.CSS("#eg-address"), "127.0.0.1"), submitEgress)
	b.wait("the address error", `document.getElementById("eg-address-error").textContent.startsWith("invalid_argument: spec.socks5.address")`)
	b.do(chromedp.SetValue(chromedp.CSS("#eg-address"), "10.1.2.3:1080"), submitEgress)
	b.wait("the range error", `document.getElementById("eg-address-error").textContent.includes("10.0.0.0/8")`)
	b.screenshot("egress-refused")
	// A username without its password: refused next to the username.
	b.do(chromedp.SetValue(chromedp.CSS("#eg-address"), "127.0.0.1:1080"), chromedp.SetValue(chromedp.CSS("#eg-username"), "me"), submitEgress)
	b.wait("the credentials error", `document.getElementById("eg-username-error").textContent.includes("username and password")`)
	if n := len(listEgresses()); n != 0 {
		t.Fatalf("refused creates stored %d egresses", n)
	}

	// Created with credentials, TLS and labels.
	b.do(chromedp.SetValue(chromedp.CSS("#eg-password"), "secret"), chromedp.Click(chromedp.CSS("#eg-tls")),
		chromedp.SetValue(chromedp.CSS("#eg-server-name"), "proxy.example.com"), chromedp.SetValue(chromedp.CSS("#eg-labels"), "made-by=console"),
		submitEgress)
	b.wait("the egress listed", `document.querySelector("table[aria-label=Egresses] tbody tr") !== null`)
	es := listEgresses()
	if len(es) != 1 || es[0].GetSpec().GetSocks5().GetAddress() != "127.0.0.1:1080" || es[0].GetSpec().GetSocks5().GetUsername() != "me" ||
		es[0].GetSpec().GetSocks5().GetTls().GetServerName() != "proxy.example.com" || es[0].GetLabels()["made-by"] != "console" {
		t.Fatalf("egresses after the create: %v", es)
	}
	eg := es[0]
	b.screenshot("egress-created")

	// Edit: the form loads the row at its revision; another client's update
	// makes the edit stale, which shows the conflict and stores nothing.
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Edit ` + eg.GetEgressId() + `"]`)))
	b.wait("the egress in the form", `document.getElementById("eg-address").value === "127.0.0.1:1080" && document.getElementById("eg-username").value === "me"`)
	other, err := egresses.UpdateEgress(ctx, connect.NewRequest(&ctrlv1.UpdateEgressRequest{
		Command: &ctrlv1.CommandMetadata{CommandId: uuid.NewString()}, EgressId: eg.GetEgressId(), ExpectedRevision: eg.GetRevision(),
		Spec: &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "127.0.0.1:1082"}}}}))
	if err != nil {
		t.Fatal(err)
	}
	current := other.Msg.GetEgress()
	b.do(chromedp.SetValue(chromedp.CSS("#eg-address"), "127.0.0.1:1081"), chromedp.SetValue(chromedp.CSS("#eg-password"), "secret"), submitEgress)
	b.wait("the conflict", `document.getElementById("eg-form-error").textContent.startsWith("aborted:")`)
	if c := b.text("#eg-current"); c != fmt.Sprintf("revision %d: socks5 127.0.0.1:1082", current.GetRevision()) {
		t.Errorf("the current egress shown is %q", c)
	}
	b.screenshot("egress-conflict")
	if e := listEgresses()[0]; e.GetRevision() != current.GetRevision() || e.GetSpec().GetSocks5().GetAddress() != "127.0.0.1:1082" {
		t.Fatalf("a stale edit changed the egress: %v", e)
	}
	// Edit the current one: address, UDP, labels.
	b.do(chromedp.Click(chromedp.CSS(`#eg-conflict button`)))
	b.wait("the current egress in the form", `document.querySelector("form[aria-labelledby=eg-form-title]").dataset.revision === `+js(fmt.Sprint(current.GetRevision())))
	b.do(chromedp.SetValue(chromedp.CSS("#eg-address"), "127.0.0.1:1081"), chromedp.Click(chromedp.CSS("#eg-udp")),
		chromedp.SetValue(chromedp.CSS("#eg-labels"), "made-by=console, tier=2"), chromedp.SetValue(chromedp.CSS("#eg-drain"), "0"), submitEgress)
	b.wait("the form back to create", `document.querySelector("form[aria-labelledby=eg-form-title]").dataset.editing === ""`)
	b.wait("the new revision listed", fmt.Sprintf(`document.querySelector("table[aria-label=Egresses] tbody tr td:nth-child(2)")?.textContent === "%d"`, current.GetRevision()+1))
	if e := listEgresses()[0]; e.GetRevision() != current.GetRevision()+1 || e.GetSpec().GetSocks5().GetAddress() != "127.0.0.1:1081" ||
		!e.GetSpec().GetUdpEnabled() || e.GetLabels()["tier"] != "2" {
		t.Fatalf("the egress after the edit: %v", e)
	}

	// A Resolver: an https one with an http URL refused next to the URL,
	// then a udp one created and edited into a tls one.
	b.do(chromedp.SetValue(chromedp.CSS("#rs-protocol"), "https"), chromedp.SetValue(chromedp.CSS("#rs-url"), "http://dns.example.com/dns-query"), submitResolver)
	b.wait("the URL error", `document.getElementById("rs-url-error").textContent.includes("must be an https:// URL")`)
	b.screenshot("resolver-refused")
	b.do(chromedp.SetValue(chromedp.CSS("#rs-protocol"), "udp"), chromedp.SetValue(chromedp.CSS("#rs-address"), "192.0.2.53"), submitResolver)
	b.wait("the address error", `document.getElementById("rs-address-error").textContent.startsWith("invalid_argument: spec.udp.address")`)
	if n := len(listResolvers()); n != 0 {
		t.Fatalf("refused creates stored %d resolvers", n)
	}
	b.do(chromedp.SetValue(chromedp.CSS("#rs-address"), "192.0.2.53:53"), submitResolver)
	b.wait("the resolver listed", `document.querySelector("table[aria-label=Resolvers] tbody tr") !== null`)
	rs := listResolvers()
	if len(rs) != 1 || rs[0].GetSpec().GetUdp().GetAddress() != "192.0.2.53:53" {
		t.Fatalf("resolvers after the create: %v", rs)
	}
	b.do(chromedp.Click(chromedp.CSS(`button[aria-label="Edit ` + rs[0].GetResolverId() + `"]`)))
	b.wait("the resolver in the form", `document.getElementById("rs-address").value === "192.0.2.53:53"`)
	b.do(chromedp.SetValue(chromedp.CSS("#rs-protocol"), "tls"), chromedp.SetValue(chromedp.CSS("#rs-address"), "192.0.2.53:853"),
		chromedp.SetValue(chromedp.CSS("#rs-server-name"), "dns.example.com"), submitResolver)
	b.wait("the resolver's new revision", `document.querySelector("table[aria-label=Resolvers] tbody tr td:nth-child(2)")?.textContent === "2"`)
	if r := listResolvers()[0]; r.GetSpec().GetTls().GetAddress() != "192.0.2.53:853" || r.GetSpec().GetTls().GetServerName() != "dns.example.com" {
		t.Fatalf("the resolver after the edit: %v", r)
	}
	b.screenshot("upstreams")
}

// TestConsoleRoles signs in with a viewer's and an editor's token: the
// header names each role as the API gives it, and the page offers only
// what the role may call.
func TestConsoleRoles(t *testing.T) {
	requireBundle(t)
	d := uptest.Shared(t)
	admin := adminv1connect.NewAdminServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(d.Project(t))))
	tokenOf := func(role adminv1.Role) string {
		t.Helper()
		r, err := admin.CreateToken(t.Context(), connect.NewRequest(&adminv1.CreateTokenRequest{Role: role, Name: role.String()}))
		if err != nil {
			t.Fatal(err)
		}
		return r.Msg.GetSecret()
	}
	b := newPage(t)
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll(%q).length`, sel)))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	b.signIn(d.URL, tokenOf(adminv1.Role_ROLE_VIEWER), "viewer")
	b.wait("the list", `document.querySelector("table[aria-label=Workspaces]") !== null`)
	actions, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](`[...document.querySelectorAll("th")].filter(th => th.textContent === "Actions").length`))
	if err != nil {
		t.Fatal(err)
	}
	if n := count("form.create") + actions; n != 0 {
		t.Errorf("a viewer is offered the create form or actions (%d)", n)
	}
	b.screenshot("viewer-workspaces")
	b.do(chromedp.Navigate(d.URL+"/#/resources"), chromedp.WaitVisible(chromedp.CSS("table[aria-label=Egresses]")))
	if n := count("form") + count("button.danger") + count(`table[aria-label=Tokens]`); n != 0 {
		t.Errorf("a viewer is offered %d forms, deletions or tokens on the resources page", n)
	}
	b.screenshot("viewer-resources")
	b.do(chromedp.Click(chromedp.CSS(`#who button`)), chromedp.WaitVisible(chromedp.CSS("#token")))

	b.signIn(d.URL, tokenOf(adminv1.Role_ROLE_EDITOR), "editor")
	b.wait("the create form", `document.querySelector("form.create") !== null`)
	b.do(chromedp.Navigate(d.URL+"/#/resources"), chromedp.WaitVisible(chromedp.CSS("#eg-address")))
	if n := count(`table[aria-label=Tokens]`); n != 0 {
		t.Errorf("an editor is shown the tokens")
	}

	// A token revoked under the page: the page goes back to the sign-in
	// form and says why.
	b.do(chromedp.Click(chromedp.CSS(`#who button`)), chromedp.WaitVisible(chromedp.CSS("#token")))
	revoked, err := admin.CreateToken(t.Context(), connect.NewRequest(&adminv1.CreateTokenRequest{Role: adminv1.Role_ROLE_EDITOR, Name: "revoked"}))
	if err != nil {
		t.Fatal(err)
	}
	b.signIn(d.URL, revoked.Msg.GetSecret(), "editor")
	if _, err := admin.RevokeToken(t.Context(), connect.NewRequest(&adminv1.RevokeTokenRequest{TokenId: revoked.Msg.GetToken().GetTokenId()})); err != nil {
		t.Fatal(err)
	}
	b.wait("the sign-in form again", `document.getElementById("signin-notice")?.textContent.includes("sign in again") && document.getElementById("who").textContent === ""`)
	b.screenshot("token-revoked")
}

// logShells logs the processes of the workspace and what the guest
// replays of the console's shell: when the terminal's replay misses
// output, whether the guest or the page lost it.
func logShells(t *testing.T, url, token, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := sdk.New(url, token).Workspace(ctx, id)
	if err != nil {
		t.Logf("the workspace: %v", err)
		return
	}
	procs, err := ws.Processes(ctx)
	for _, p := range procs {
		t.Logf("process %d tag %q args %q exited %v", p.GetPid(), p.GetTag(), p.GetArgs(), p.GetExited())
	}
	if err != nil {
		t.Logf("processes: %v", err)
	}
	var out testutil.SyncBuffer
	if _, err := ws.Connect(ctx, sdk.Tag("console-terminal"), &out, &out); err != nil {
		t.Logf("connect: %v", err)
		return
	}
	time.Sleep(2 * time.Second)
	t.Logf("the guest replays %q", out.String())
}

// TestConsoleListsEveryPage: the resources page lists every Egress though
// the server ends a page at 4 MiB: 30 Egresses with 200 KiB of
// annotations each come in two pages, and all 30 are shown.
func TestConsoleListsEveryPage(t *testing.T) {
	requireBundle(t)
	d := uptest.Shared(t)
	token := d.Project(t)
	egresses := ctrlv1connect.NewEgressServiceClient(http.DefaultClient, d.URL, connect.WithInterceptors(bearer.Token(token)))
	big := strings.Repeat("x", 200<<10)
	for range 30 {
		if _, err := egresses.CreateEgress(t.Context(), connect.NewRequest(&ctrlv1.CreateEgressRequest{
			Command:     &ctrlv1.CommandMetadata{CommandId: uuid.NewString()},
			Spec:        &ctrlv1.EgressSpec{Protocol: &ctrlv1.EgressSpec_Socks5{Socks5: &ctrlv1.Socks5Egress{Address: "127.0.0.1:1080"}}},
			Annotations: map[string]string{"big": big},
		})); err != nil {
			t.Fatal(err)
		}
	}
	first, err := egresses.ListEgresses(t.Context(), connect.NewRequest(&ctrlv1.ListEgressesRequest{PageSize: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	if first.Msg.GetNextPageToken() == "" {
		t.Fatalf("30 Egresses of 200 KiB came in one page of %d: nothing for the console to follow", len(first.Msg.GetEgresses()))
	}
	b := newPage(t)
	b.signIn(d.URL, token, "admin")
	b.do(chromedp.Navigate(d.URL + "/#/resources"))
	b.wait("all 30 Egresses listed", `document.querySelectorAll("table[aria-label=Egresses] tbody tr").length === 30`)
}
