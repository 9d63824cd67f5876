package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/sdk"
)

// TestInputSendsFlagsInOrder: every flag of ws input becomes its events,
// in the order of the command line, in one DeliverInput call with the
// session's token.
func TestInputSendsFlagsInOrder(t *testing.T) {
	e, f := newCtrlEnv(t)
	f.ws = testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	e.call(t, "", "ws", "input", "ws_1", "--click", "100,200", "--type", "hello", "--key", "Return",
		"--key", "Control_L+Alt_L+t", "--key", "+", "--key", "U+20AC", "--key", "Control_L+U+20ac", "--key-down", "Shift_L",
		"--move", "5,6", "--button", "3", "--key-up", "Shift_L", "--scroll", "-1,2")
	calls, reqs := f.got()
	if calls[len(calls)-1] != "DeliverInput" || f.auth["DeliverInput"] != "Bearer session-token" {
		t.Fatalf("calls %v, DeliverInput sent %q", calls, f.auth["DeliverInput"])
	}
	var want []*datav1.InputEvent
	want = append(want, sdk.MoveTo(100, 200), sdk.Button(1), sdk.Type("hello"), sdk.Key("Return"))
	want = append(want, sdk.Chord("Control_L", "Alt_L", "t")...)
	want = append(want, sdk.Key("+"), sdk.Key("U+20AC"))
	want = append(want, sdk.Chord("Control_L", "U+20ac")...)
	want = append(want, sdk.KeyDown("Shift_L"), sdk.MoveTo(5, 6), sdk.Button(3), sdk.KeyUp("Shift_L"), sdk.Scroll(-1, 2))
	if got := reqs[len(reqs)-1]; !proto.Equal(got, &datav1.DeliverInputRequest{Events: want}) {
		t.Errorf("DeliverInput %v\nwant %v", got, want)
	}
}

func TestInputRefusesBadFlags(t *testing.T) {
	e, f := newCtrlEnv(t)
	for _, args := range [][]string{
		{},
		{"--click", "100"},
		{"--click", "-1,5"},
		{"--move", "a,b"},
		{"--scroll", "1"},
		{"--button", "left"},
		{"--key", "Control_L++"},
	} {
		_, _, err := e.run(t, "", append([]string{"ws", "input", "ws_1", "--addr", e.addr, "--token", e.token}, args...)...)
		if err == nil {
			t.Errorf("ws input %q succeeded", args)
		}
	}
	if calls, _ := f.got(); len(calls) != 0 {
		t.Errorf("refused flags made calls %v", calls)
	}
}

func TestScreenshotWritesTheFile(t *testing.T) {
	e, f := newCtrlEnv(t)
	f.ws = testWorkspace(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE)
	f.screen = &datav1.CaptureScreenResponse{Png: []byte("\x89PNG fake"), Width: 1280, Height: 800}
	file := filepath.Join(t.TempDir(), "shot.png")
	stdout, _ := e.call(t, "", "ws", "screenshot", "ws_1", "-o", file)
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, f.screen.Png) {
		t.Errorf("wrote %q, %v; want the capture", got, err)
	}
	if stdout != file+": 1280x800\n" {
		t.Errorf("printed %q", stdout)
	}
	stdout, _ = e.call(t, "", "ws", "screenshot", "ws_1", "-o", "-")
	if stdout != string(f.screen.Png) {
		t.Errorf("-o - printed %q, want the PNG", stdout)
	}
	if _, _, err := e.run(t, "", "ws", "screenshot", "ws_1", "--addr", e.addr, "--token", e.token); err == nil || !strings.Contains(err.Error(), "-o FILE") {
		t.Errorf("without -o: %v, want an error naming -o FILE", err)
	}
}

// TestScreenAndInputWithoutDisplay: on the real deployment, a Workspace of
// the built-in base (no display) refuses both, saying why.
func TestScreenAndInputWithoutDisplay(t *testing.T) {
	e, id := newDataEnv(t)
	file := filepath.Join(t.TempDir(), "shot.png")
	for _, args := range [][]string{{"ws", "screenshot", id, "-o", file}, {"ws", "input", id, "--type", "x"}} {
		_, _, err := e.runData(t, "", args...)
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "carries no display") {
			t.Errorf("%v: %v, want failed_precondition saying the template carries no display", args, err)
		}
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("a refused screenshot left %s: %v", file, err)
	}
}

func TestCreateRequiresCapabilities(t *testing.T) {
	e, f := newCtrlEnv(t)
	e.call(t, "", "ws", "create", "--template", "desktop", "--require", "screen,input", "--require", "volume.storage_pool")
	_, reqs := f.got()
	got := reqs[0].(*ctrlv1.CreateWorkspaceRequest).GetSpec().GetCapabilities().GetRequired()
	if strings.Join(got, " ") != "screen input volume.storage_pool" {
		t.Errorf("required %q", got)
	}
}
