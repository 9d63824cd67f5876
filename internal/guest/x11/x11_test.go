package x11

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
	"google.golang.org/protobuf/proto"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/testutil/hosttest"
)

// startDisplay runs Xvfb of the size on a display number no other server
// of this machine uses, through Start, and stops it when the test ends.
func startDisplay(t *testing.T, width, height int) (*Display, string) {
	t.Helper()
	hosttest.RequireXvfb(t)
	number := hosttest.FreeDisplay(t)
	launch := func(args []string, tag string) (<-chan struct{}, error) {
		cmd := exec.Command(args[0], args[1:]...)
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		ended := make(chan struct{})
		go func() { cmd.Wait(); close(ended) }()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-ended
		})
		return ended, nil
	}
	d, err := Start(context.Background(), Config{Number: number, Width: width, Height: height, Launch: launch, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d, fmt.Sprintf(":%d", number)
}

// client is a test's own X connection with one window that has the focus
// and reports keys, buttons and pointer motion.
type client struct {
	conn   *xgb.Conn
	window xproto.Window
}

func newClient(t *testing.T, name string, x, y, w, h int, color uint32) *client {
	t.Helper()
	conn, err := xgb.NewConnDisplay(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	screen := xproto.Setup(conn).DefaultScreen(conn)
	win, err := xproto.NewWindowId(conn)
	if err != nil {
		t.Fatal(err)
	}
	mask := uint32(xproto.EventMaskKeyPress | xproto.EventMaskKeyRelease | xproto.EventMaskButtonPress |
		xproto.EventMaskButtonRelease | xproto.EventMaskExposure)
	if err := xproto.CreateWindowChecked(conn, screen.RootDepth, win, screen.Root, int16(x), int16(y), uint16(w), uint16(h), 0,
		xproto.WindowClassInputOutput, screen.RootVisual, xproto.CwBackPixel|xproto.CwEventMask, []uint32{color, mask}).Check(); err != nil {
		t.Fatal(err)
	}
	if err := xproto.MapWindowChecked(conn, win).Check(); err != nil {
		t.Fatal(err)
	}
	if err := xproto.SetInputFocusChecked(conn, xproto.InputFocusPointerRoot, win, xproto.TimeCurrentTime).Check(); err != nil {
		t.Fatal(err)
	}
	c := &client{conn: conn, window: win}
	c.next(t, xproto.Expose) // mapped and drawn
	return c
}

// next returns the next event of the type, skipping others.
func (c *client) next(t *testing.T, eventType int) xgb.Event {
	t.Helper()
	got := make(chan xgb.Event, 1)
	go func() {
		for {
			ev, err := c.conn.WaitForEvent()
			if ev == nil && err == nil {
				close(got)
				return
			}
			if ev != nil && eventTypeOf(ev) == eventType {
				got <- ev
				return
			}
		}
	}()
	select {
	case ev, ok := <-got:
		if !ok {
			t.Fatal("the connection closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("no event of type %d", eventType)
		return nil
	}
}

func eventTypeOf(ev xgb.Event) int {
	switch ev.(type) {
	case xproto.KeyPressEvent:
		return xproto.KeyPress
	case xproto.KeyReleaseEvent:
		return xproto.KeyRelease
	case xproto.ButtonPressEvent:
		return xproto.ButtonPress
	case xproto.ButtonReleaseEvent:
		return xproto.ButtonRelease
	case xproto.ExposeEvent:
		return xproto.Expose
	}
	return -1
}

// typed reads n key presses and returns the keysyms they produce under the
// keyboard map as it is now (column 1 when Shift is held).
func (c *client) typed(t *testing.T, n int) []uint32 {
	t.Helper()
	km, err := loadKeymap(c.conn)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint32
	for len(out) < n {
		ev := c.next(t, xproto.KeyPress).(xproto.KeyPressEvent)
		col := 0
		if ev.State&xproto.ModMaskShift != 0 {
			col = 1
		}
		ks := uint32(km.column(int(ev.Detail-km.min), col))
		if ks == namedKeysyms["Shift_L"] {
			continue
		}
		out = append(out, ks)
	}
	return out
}

func keyEvent(name string, down *bool) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_Key{Key: &datav1.KeyInput{Keysym: name, Down: down}}}
}

func textEvent(s string) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_Text{Text: &datav1.TextInput{Text: s}}}
}

func moveEvent(x, y uint32) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_PointerMove{PointerMove: &datav1.PointerMoveInput{X: x, Y: y}}}
}

func buttonEvent(b uint32, down *bool) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_Button{Button: &datav1.ButtonInput{Button: b, Down: down}}}
}

func scrollEvent(dx, dy int32) *datav1.InputEvent {
	return &datav1.InputEvent{Event: &datav1.InputEvent_Scroll{Scroll: &datav1.ScrollInput{Dx: dx, Dy: dy}}}
}

func TestCaptureShowsTheScreen(t *testing.T) {
	d, name := startDisplay(t, 640, 480)
	newClient(t, name, 100, 50, 200, 100, 0x3366cc)
	shot, err := d.Capture()
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(shot.PNG))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 640 || b.Dy() != 480 || shot.Width != 640 || shot.Height != 480 {
		t.Fatalf("capture is %v (%dx%d), want 640x480", b, shot.Width, shot.Height)
	}
	rgb := func(x, y int) uint32 {
		r, g, b, _ := img.At(x, y).RGBA()
		return r>>8<<16 | g>>8<<8 | b>>8
	}
	if got := rgb(150, 100); got != 0x3366cc {
		t.Errorf("pixel inside the window is %06x, want 3366cc", got)
	}
	if got := rgb(10, 10); got == 0x3366cc {
		t.Errorf("pixel outside the window has the window's color")
	}
	// A second capture sees a change.
	newClient(t, name, 0, 0, 50, 50, 0xff0000)
	shot, err = d.Capture()
	if err != nil {
		t.Fatal(err)
	}
	if img, err = png.Decode(bytes.NewReader(shot.PNG)); err != nil {
		t.Fatal(err)
	}
	if got := rgb(10, 10); got != 0xff0000 {
		t.Errorf("pixel of the new window is %06x, want ff0000", got)
	}
}

func TestDeliverTypesKeysAndText(t *testing.T) {
	d, name := startDisplay(t, 320, 200)
	c := newClient(t, name, 0, 0, 320, 200, 0)
	down, up := proto.Bool(true), proto.Bool(false)
	err := d.Deliver([]*datav1.InputEvent{
		textEvent("aB!é€ж\n"),
		keyEvent("Return", nil),
		keyEvent("Control_L", down), keyEvent("t", nil), keyEvent("Control_L", up),
		keyEvent("U+00DF", nil), keyEvent("F5", nil), keyEvent("ä", nil), keyEvent("0xff09", nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []uint32{'a', 'B', '!', 0xe9, 0x10020ac, 0x1000436, 0xff0d, 0xff0d, 0xffe3, 't', 0xdf, 0xffc2, 0xe4, 0xff09}
	got := c.typed(t, len(want))
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("typed keysyms %x, want %x", got, want)
		}
	}
	// A second batch of other characters the map lacks reuses spare keys.
	if err := d.Deliver([]*datav1.InputEvent{textEvent("ю€")}); err != nil {
		t.Fatal(err)
	}
	if got := c.typed(t, 2); got[0] != 0x100044e || got[1] != 0x10020ac {
		t.Fatalf("typed keysyms %x, want 100044e 10020ac", got)
	}
}

func TestDeliverMovesAndClicks(t *testing.T) {
	d, name := startDisplay(t, 320, 200)
	c := newClient(t, name, 0, 0, 320, 200, 0)
	err := d.Deliver([]*datav1.InputEvent{
		moveEvent(100, 150), buttonEvent(1, nil), buttonEvent(3, proto.Bool(true)), buttonEvent(3, proto.Bool(false)),
		scrollEvent(-1, 2),
	})
	if err != nil {
		t.Fatal(err)
	}
	var buttons []byte
	for range 5 {
		ev := c.next(t, xproto.ButtonPress).(xproto.ButtonPressEvent)
		if ev.EventX != 100 || ev.EventY != 150 {
			t.Errorf("button %d pressed at %d,%d, want 100,150", ev.Detail, ev.EventX, ev.EventY)
		}
		buttons = append(buttons, byte(ev.Detail))
	}
	if !bytes.Equal(buttons, []byte{1, 3, 5, 5, 6}) {
		t.Errorf("buttons pressed %v, want [1 3 5 5 6]", buttons)
	}
	p, err := xproto.QueryPointer(c.conn, c.window).Reply()
	if err != nil {
		t.Fatal(err)
	}
	if p.RootX != 100 || p.RootY != 150 {
		t.Errorf("pointer at %d,%d, want 100,150", p.RootX, p.RootY)
	}
}

func TestDeliverRefusesABadBatchWhole(t *testing.T) {
	d, name := startDisplay(t, 320, 200)
	c := newClient(t, name, 0, 0, 320, 200, 0)
	many := make([]*datav1.InputEvent, MaxEvents+1)
	for i := range many {
		many[i] = moveEvent(1, 1)
	}
	for name, batch := range map[string][]*datav1.InputEvent{
		"unknown keysym":     {moveEvent(10, 10), keyEvent("NoSuchKey", nil)},
		"two characters":     {moveEvent(10, 10), keyEvent("ab", nil)},
		"bad code point":     {moveEvent(10, 10), keyEvent("U+110000", nil)},
		"outside the screen": {moveEvent(10, 10), moveEvent(320, 0)},
		"button 0":           {moveEvent(10, 10), buttonEvent(0, nil)},
		"no such button":     {moveEvent(10, 10), buttonEvent(200, nil)},
		"long scroll":        {moveEvent(10, 10), scrollEvent(0, MaxScrollSteps+1)},
		"control character":  {moveEvent(10, 10), textEvent("a\rb")},
		"long text":          {moveEvent(10, 10), textEvent(strings.Repeat("a", MaxTextRunes+1))},
		"invalid UTF-8":      {moveEvent(10, 10), textEvent("a\xffb")},
		"empty event":        {moveEvent(10, 10), {}},
		"no events":          {},
		"too many events":    many,
	} {
		err := d.Deliver(batch)
		if !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: %v, want ErrInvalidInput", name, err)
		}
	}
	p, err := xproto.QueryPointer(c.conn, c.window).Reply()
	if err != nil {
		t.Fatal(err)
	}
	if p.RootX == 10 && p.RootY == 10 {
		t.Error("a refused batch moved the pointer")
	}
}

func TestDeliverRefusesMoreNewKeysymsThanSpareKeys(t *testing.T) {
	d, _ := startDisplay(t, 320, 200)
	km, err := loadKeymap(d.conn)
	if err != nil {
		t.Fatal(err)
	}
	spares := len(newPlanner(km, nil).spares)
	if spares == 0 {
		t.Fatal("the keyboard map has no spare keycode")
	}
	var text []rune
	for i := range spares + 1 {
		text = append(text, rune(0x4e00+i)) // CJK ideographs: on no key
	}
	if err := d.Deliver([]*datav1.InputEvent{textEvent(string(text[:spares]))}); err != nil {
		t.Fatalf("%d new keysyms: %v", spares, err)
	}
	if err := d.Deliver([]*datav1.InputEvent{textEvent(string(text))}); !errors.Is(err, ErrInvalidInput) {
		t.Fatalf("%d new keysyms: %v, want ErrInvalidInput", spares+1, err)
	}
}

func TestStartFailsWithoutAServer(t *testing.T) {
	launch := func(args []string, tag string) (<-chan struct{}, error) {
		ended := make(chan struct{})
		close(ended) // the server ends at once
		return ended, nil
	}
	_, err := Start(context.Background(), Config{Number: hosttest.FreeDisplay(t), Width: 64, Height: 64, Launch: launch})
	if err == nil || !strings.Contains(err.Error(), "ended") {
		t.Fatalf("Start: %v, want an error saying the server ended", err)
	}
}

func TestParseKeysym(t *testing.T) {
	for name, want := range map[string]uint32{
		"Return": 0xff0d, "a": 'a', "A": 'A', "exclam": '!', "!": '!', "F12": 0xffc9, "KP_Enter": 0xff8d,
		"é": 0xe9, "€": 0x10020ac, "EuroSign": 0x20ac, "U+20AC": 0x10020ac, "U+0041": 'A', "0x1008ff13": 0x1008ff13,
		" ": ' ', "space": ' ',
	} {
		got, err := parseKeysym(name)
		if err != nil || got != want {
			t.Errorf("parseKeysym(%q) = %#x, %v; want %#x", name, got, err, want)
		}
	}
	for _, name := range []string{"", "Retrun", "ab", "U+", "U+41", "U+ZZZZ", "0x", "0x0", "0x20000000", "\x01", "\x7f"} {
		if _, err := parseKeysym(name); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("parseKeysym(%q): %v, want ErrInvalidInput", name, err)
		}
	}
}

// BenchmarkCapture times one capture of a 1280x800 screen holding 200
// overlapping rectangles of as many colors: the pixels' transfer and the
// PNG encoding, which is most of it.
func BenchmarkCapture(b *testing.B) {
	hosttest.RequireXvfb(b)
	number := hosttest.FreeDisplay(b)
	cmd := exec.Command("Xvfb", fmt.Sprintf(":%d", number), "-screen", "0", "1280x800x24", "-nolisten", "tcp")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var d *Display
	err := poll(context.Background(), nil, func() bool {
		var err error
		d, err = Connect(fmt.Sprintf(":%d", number))
		return err == nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	gc, err := xproto.NewGcontextId(d.conn)
	if err != nil {
		b.Fatal(err)
	}
	xproto.CreateGC(d.conn, gc, xproto.Drawable(d.root), 0, nil)
	for i := range 200 {
		xproto.ChangeGC(d.conn, gc, xproto.GcForeground, []uint32{uint32(i*9973) & 0xffffff})
		xproto.PolyFillRectangle(d.conn, xproto.Drawable(d.root), gc, []xproto.Rectangle{{X: int16(i * 6), Y: int16(i * 4), Width: 100, Height: 60}})
	}
	if err := d.sync(); err != nil {
		b.Fatal(err)
	}
	size := 0
	for b.Loop() {
		shot, err := d.Capture()
		if err != nil {
			b.Fatal(err)
		}
		size = len(shot.PNG)
	}
	b.ReportMetric(float64(size), "png-bytes")
}
