// Package x11 is the guest agent's X11 client. For a template that carries
// a display it starts the X server (Xvfb) and the image's window manager,
// captures the screen (capture.go) and delivers keyboard and pointer input
// through the XTEST extension (input.go). It speaks the X11 protocol itself
// over the display's unix socket (github.com/jezek/xgb): no X tool runs per
// call.
package x11

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
	"github.com/jezek/xgb/xtest"
)

// ErrDisplay marks a failure of the display itself: the X server ended or
// refused a request. Callers see it as unavailable.
var ErrDisplay = errors.New("display")

// Tags of the programs Start launches, as the process service lists them.
const (
	ServerTag        = "display"
	WindowManagerTag = "window-manager"
)

// sessions are the Debian alternatives that name an image's desktop
// session (its window manager with what the session starts, such as
// openbox-session) and its bare window manager, in the order Start
// prefers them.
var sessions = []string{"x-session-manager", "x-window-manager"}

// DefaultTimeout bounds how long Start waits for the X server and for the
// window manager.
const DefaultTimeout = 30 * time.Second

// Launcher starts a program of the guest (args[0] looked up in PATH) under
// tag, with the agent's environment, and returns a channel closed once the
// program has ended. The agent's process service is one.
type Launcher func(args []string, tag string) (ended <-chan struct{}, err error)

// Config says which display Start runs.
type Config struct {
	// Number is the display's number: the display is ":Number" and its
	// socket /tmp/.X11-unix/X<Number>. The guest agent runs 0.
	Number int
	// Width and Height are the screen's size in pixels.
	Width, Height int
	// Launch starts the X server and the window manager (required).
	Launch Launcher
	// Timeout bounds each wait of Start; zero is DefaultTimeout.
	Timeout time.Duration
	// Logf, if set, receives diagnostics.
	Logf func(format string, args ...any)
}

// Display is a connection to a running X display: what CaptureScreen and
// DeliverInput use. Its methods are safe for concurrent use.
type Display struct {
	conn   *xgb.Conn
	root   xproto.Window
	width  int
	height int

	captureMu sync.Mutex
	capture   capturer

	inputMu sync.Mutex
	input   inputState

	errMu   sync.Mutex
	lastErr error // the latest error the server sent for an unchecked request
	closed  bool
}

// Start runs the display cfg names: Xvfb at cfg's size with 24-bit color,
// listening on its unix socket only, then, when the image has one, its
// x-session-manager, else its x-window-manager; it returns once the X
// server accepts connections and the window manager has started (see
// awaitWindowManager). A window manager that ends or does not start in
// time is logged, not an error: the display works without one.
func Start(ctx context.Context, cfg Config) (*Display, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	name := ":" + strconv.Itoa(cfg.Number)
	// Leftovers of an earlier server of this number would make Xvfb refuse.
	os.Remove(fmt.Sprintf("/tmp/.X%d-lock", cfg.Number))
	os.Remove(fmt.Sprintf("/tmp/.X11-unix/X%d", cfg.Number))
	serverEnded, err := cfg.Launch([]string{"Xvfb", name, "-screen", "0",
		fmt.Sprintf("%dx%dx24", cfg.Width, cfg.Height), "-nolisten", "tcp"}, ServerTag)
	if err != nil {
		return nil, fmt.Errorf("starting Xvfb: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	var conn *xgb.Conn
	err = poll(ctx, serverEnded, func() bool {
		conn, err = xgb.NewConnDisplay(name)
		return err == nil
	})
	if err != nil {
		return nil, fmt.Errorf("Xvfb on %s: %w", name, err)
	}
	d, err := newDisplay(conn)
	if err != nil {
		return nil, fmt.Errorf("Xvfb on %s: %w", name, err)
	}
	i := slices.IndexFunc(sessions, func(s string) bool { _, err := exec.LookPath(s); return err == nil })
	if i < 0 {
		cfg.Logf("display %s: the image has neither %s; running without a window manager", name, strings.Join(sessions, " nor "))
		return d, nil
	}
	wmEnded, err := cfg.Launch([]string{sessions[i]}, WindowManagerTag)
	if err != nil {
		cfg.Logf("display %s: starting %s: %v", name, sessions[i], err)
		return d, nil
	}
	if err := d.awaitWindowManager(ctx, cfg.Number, wmEnded); err != nil {
		cfg.Logf("display %s: %s did not take the screen: %v", name, sessions[i], err)
	}
	return d, nil
}

// awaitWindowManager waits until a client owns the selection WM_S<n>,
// which an ICCCM window manager takes once it manages the screen, and then,
// when it says it supports _NET_REQUEST_FRAME_EXTENTS (EWMH), until it
// answers such a request: it takes the selection early in its start, and
// reads requests only once it has started (key bindings and all).
func (d *Display) awaitWindowManager(ctx context.Context, number int, ended <-chan struct{}) error {
	selection, err := d.atom("WM_S" + strconv.Itoa(number))
	if err != nil {
		return err
	}
	err = poll(ctx, ended, func() bool {
		owner, err := xproto.GetSelectionOwner(d.conn, selection).Reply()
		return err == nil && owner.Owner != xproto.WindowNone
	})
	if err != nil {
		return err
	}
	return d.awaitFrameExtents(ctx, ended)
}

// awaitFrameExtents asks the window manager for the frame extents of a
// window of its own (never mapped) and waits for its answer, the window's
// property _NET_FRAME_EXTENTS; without support for the request it returns
// at once.
func (d *Display) awaitFrameExtents(ctx context.Context, ended <-chan struct{}) error {
	var atoms [3]xproto.Atom
	for i, name := range []string{"_NET_SUPPORTED", "_NET_REQUEST_FRAME_EXTENTS", "_NET_FRAME_EXTENTS"} {
		a, err := d.atom(name)
		if err != nil {
			return err
		}
		atoms[i] = a
	}
	supported, request, extents := atoms[0], atoms[1], atoms[2]
	var listed bool
	err := poll(ctx, ended, func() bool {
		p, err := xproto.GetProperty(d.conn, false, d.root, supported, xproto.AtomAtom, 0, 4096).Reply()
		if err != nil || p.Format != 32 {
			return false // not set yet
		}
		for i := 0; i+4 <= len(p.Value); i += 4 {
			listed = listed || xproto.Atom(xgb.Get32(p.Value[i:])) == request
		}
		return true
	})
	if err != nil || !listed {
		return err
	}
	win, err := xproto.NewWindowId(d.conn)
	if err != nil {
		return err
	}
	if err := xproto.CreateWindowChecked(d.conn, 0, win, d.root, 0, 0, 1, 1, 0, xproto.WindowClassInputOutput, 0, 0, nil).Check(); err != nil {
		return err
	}
	defer xproto.DestroyWindow(d.conn, win)
	ev := xproto.ClientMessageEvent{Format: 32, Window: win, Type: request, Data: xproto.ClientMessageDataUnionData32New(make([]uint32, 5))}
	mask := uint32(xproto.EventMaskSubstructureNotify | xproto.EventMaskSubstructureRedirect)
	if err := xproto.SendEventChecked(d.conn, false, d.root, mask, string(ev.Bytes())).Check(); err != nil {
		return err
	}
	return poll(ctx, ended, func() bool {
		p, err := xproto.GetProperty(d.conn, false, win, extents, xproto.GetPropertyTypeAny, 0, 4).Reply()
		return err == nil && p.Format != 0
	})
}

// atom returns the atom of name, interning it.
func (d *Display) atom(name string) (xproto.Atom, error) {
	r, err := xproto.InternAtom(d.conn, false, uint16(len(name)), name).Reply()
	if err != nil {
		return 0, err
	}
	return r.Atom, nil
}

// poll calls ready every 10 ms until it reports true, ended is closed (the
// program waited for ended) or ctx ends.
func poll(ctx context.Context, ended <-chan struct{}, ready func() bool) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !ready() {
		select {
		case <-ended:
			return errors.New("the program ended")
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

func init() {
	// xgb logs to stderr, also that it connects without an authority
	// file, which is how the agent connects; errors reach callers anyway.
	xgb.Logger = log.New(io.Discard, "", 0)
}

// Connect connects to the running X display name (":0") and prepares
// capture and input: its default screen must be 24-bit TrueColor with 32
// bits per pixel (as Xvfb's "x24" is), and it must offer XTEST.
func Connect(name string) (*Display, error) {
	conn, err := xgb.NewConnDisplay(name)
	if err != nil {
		return nil, err
	}
	return newDisplay(conn)
}

// newDisplay prepares capture and input on conn, which it closes on error.
func newDisplay(conn *xgb.Conn) (*Display, error) {
	d, err := prepare(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	go d.drain()
	return d, nil
}

func prepare(conn *xgb.Conn) (*Display, error) {
	setup := xproto.Setup(conn)
	screen := setup.DefaultScreen(conn)
	if err := checkPixelFormat(setup, screen); err != nil {
		return nil, err
	}
	if err := xtest.Init(conn); err != nil {
		return nil, fmt.Errorf("the X server offers no XTEST: %w", err)
	}
	d := &Display{conn: conn, root: screen.Root, width: int(screen.WidthInPixels), height: int(screen.HeightInPixels)}
	d.capture = newCapturer(conn, d.root, d.width, d.height)
	if err := d.input.init(conn); err != nil {
		return nil, err
	}
	return d, nil
}

// checkPixelFormat checks that the screen's pixels are 32-bit words of
// 8-bit red, green and blue (from the high byte down), the layout capture
// converts.
func checkPixelFormat(setup *xproto.SetupInfo, screen *xproto.ScreenInfo) error {
	if screen.RootDepth != 24 {
		return fmt.Errorf("the screen's depth is %d, want 24", screen.RootDepth)
	}
	bpp := 0
	for _, f := range setup.PixmapFormats {
		if f.Depth == 24 {
			bpp = int(f.BitsPerPixel)
		}
	}
	if bpp != 32 {
		return fmt.Errorf("the screen stores %d bits per pixel, want 32", bpp)
	}
	if setup.ImageByteOrder != xproto.ImageOrderLSBFirst {
		return errors.New("the screen's image byte order is MSB first, want LSB first")
	}
	for _, depth := range screen.AllowedDepths {
		for _, v := range depth.Visuals {
			if v.VisualId == screen.RootVisual {
				if v.Class != xproto.VisualClassTrueColor || v.RedMask != 0xff0000 || v.GreenMask != 0xff00 || v.BlueMask != 0xff {
					return errors.New("the screen's visual is not 8-bit-per-channel TrueColor RGB")
				}
				return nil
			}
		}
	}
	return errors.New("the screen's root visual is not listed")
}

// drain reads what the server sends unasked: the errors of unchecked
// requests, kept for the call that made them, and events every client
// receives (MappingNotify), which nothing here needs. It ends with the
// connection.
func (d *Display) drain() {
	for {
		ev, xerr := d.conn.WaitForEvent()
		if ev == nil && xerr == nil {
			d.errMu.Lock()
			d.closed = true
			d.errMu.Unlock()
			return
		}
		if xerr != nil {
			d.errMu.Lock()
			d.lastErr = xerr
			d.errMu.Unlock()
		}
	}
}

// takeError returns and forgets the latest error the server sent, or
// ErrDisplay when the connection is gone.
func (d *Display) takeError() error {
	d.errMu.Lock()
	defer d.errMu.Unlock()
	err := d.lastErr
	d.lastErr = nil
	if err != nil {
		return fmt.Errorf("%w: the X server refused a request: %v", ErrDisplay, err)
	}
	if d.closed {
		return fmt.Errorf("%w: the connection to the X server is closed", ErrDisplay)
	}
	return nil
}

// sync waits until the server has processed every request sent so far and
// returns the error of any of them.
func (d *Display) sync() error {
	d.takeError() // an older call's
	if _, err := xproto.GetInputFocus(d.conn).Reply(); err != nil {
		return displayError(err)
	}
	return d.takeError()
}

// displayError marks err, of a request to the X server, as ErrDisplay.
func displayError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %v", ErrDisplay, err)
}

// Size returns the screen's size in pixels.
func (d *Display) Size() (width, height int) { return d.width, d.height }

// Close closes the connection; the X server keeps running.
func (d *Display) Close() {
	d.captureMu.Lock()
	d.capture.close()
	d.captureMu.Unlock()
	d.conn.Close()
}
