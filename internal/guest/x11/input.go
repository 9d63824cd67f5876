package x11

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
	"github.com/jezek/xgb/xtest"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
)

// Limits of one batch of input.
const (
	// MaxEvents bounds the events of one batch.
	MaxEvents = 1000
	// MaxTextRunes bounds the characters of one text event.
	MaxTextRunes = 4096
	// MaxScrollSteps bounds a scroll event's steps each way.
	MaxScrollSteps = 100
)

// ErrInvalidInput marks a batch Deliver refuses before delivering any of
// it.
var ErrInvalidInput = errors.New("invalid input")

func invalidInput(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidInput}, args...)...)
}

// inputState is what input remembers between batches.
type inputState struct {
	// buttons is the number of the pointer's buttons.
	buttons int
	// remapped are the spare keycodes batches gave keysyms the keyboard
	// map lacked, least recently given first: they are given again when
	// no keycode is left empty.
	remapped []xproto.Keycode
}

func (s *inputState) init(conn *xgb.Conn) error {
	m, err := xproto.GetPointerMapping(conn).Reply()
	if err != nil {
		return displayError(err)
	}
	s.buttons = len(m.Map)
	return nil
}

// fakeEvent is one XTEST event: a key or button press or release
// (detail is the keycode or button), or a pointer move to x, y.
type fakeEvent struct {
	kind   byte
	detail byte
	x, y   int16
}

// Deliver delivers events in order through XTEST and returns once the X
// server has processed them. The whole batch is checked first: a bad event
// is ErrInvalidInput and nothing is delivered. Keysyms the keyboard map
// lacks are given spare keycodes (keycodes with no keysym) before the
// first event; a batch needs at most as many such keysyms as the map has
// spare keycodes.
func (d *Display) Deliver(events []*datav1.InputEvent) error {
	if len(events) == 0 || len(events) > MaxEvents {
		return invalidInput("a batch holds 1 to %d events, not %d", MaxEvents, len(events))
	}
	d.inputMu.Lock()
	defer d.inputMu.Unlock()
	var keys *planner
	if slices.ContainsFunc(events, func(e *datav1.InputEvent) bool { return e.GetKey() != nil || e.GetText() != nil }) {
		km, err := loadKeymap(d.conn)
		if err != nil {
			return err
		}
		keys = newPlanner(km, d.input.remapped)
	}
	var fakes []fakeEvent
	for i, ev := range events {
		var err error
		if fakes, err = d.plan(fakes, ev, keys); err != nil {
			return fmt.Errorf("events[%d]: %w", i, err)
		}
	}
	if keys != nil {
		for _, r := range keys.remaps {
			syms := make([]xproto.Keysym, keys.km.per)
			syms[0] = xproto.Keysym(r.keysym)
			if len(syms) > 1 {
				syms[1] = syms[0]
			}
			xproto.ChangeKeyboardMapping(d.conn, 1, r.keycode, byte(keys.km.per), syms)
			d.input.remapped = append(slices.DeleteFunc(d.input.remapped, func(k xproto.Keycode) bool { return k == r.keycode }), r.keycode)
		}
	}
	for _, f := range fakes {
		xtest.FakeInput(d.conn, f.kind, f.detail, 0, d.root, f.x, f.y, 0)
	}
	return d.sync()
}

// plan appends the XTEST events of ev to fakes.
func (d *Display) plan(fakes []fakeEvent, ev *datav1.InputEvent, keys *planner) ([]fakeEvent, error) {
	switch e := ev.GetEvent().(type) {
	case *datav1.InputEvent_Key:
		ks, err := parseKeysym(e.Key.GetKeysym())
		if err != nil {
			return nil, err
		}
		k, err := keys.key(ks)
		if err != nil {
			return nil, err
		}
		return k.events(fakes, e.Key.Down), nil
	case *datav1.InputEvent_Text:
		text := e.Text.GetText()
		if !utf8.ValidString(text) {
			return nil, invalidInput("text is not valid UTF-8")
		}
		if n := utf8.RuneCountInString(text); n > MaxTextRunes {
			return nil, invalidInput("text has %d characters, at most %d", n, MaxTextRunes)
		}
		for _, r := range text {
			ks, err := textKeysym(r)
			if err != nil {
				return nil, err
			}
			k, err := keys.key(ks)
			if err != nil {
				return nil, err
			}
			fakes = k.events(fakes, nil)
		}
		return fakes, nil
	case *datav1.InputEvent_PointerMove:
		x, y := e.PointerMove.GetX(), e.PointerMove.GetY()
		if x >= uint32(d.width) || y >= uint32(d.height) {
			return nil, invalidInput("pointer_move to %d,%d is outside the %dx%d screen", x, y, d.width, d.height)
		}
		return append(fakes, fakeEvent{kind: xproto.MotionNotify, x: int16(x), y: int16(y)}), nil
	case *datav1.InputEvent_Button:
		b := e.Button.GetButton()
		if b < 1 || b > uint32(d.input.buttons) {
			return nil, invalidInput("button %d: the pointer has buttons 1 to %d", b, d.input.buttons)
		}
		return pressEvents(fakes, xproto.ButtonPress, byte(b), e.Button.Down), nil
	case *datav1.InputEvent_Scroll:
		return d.scroll(fakes, e.Scroll.GetDx(), e.Scroll.GetDy())
	}
	return nil, invalidInput("the event is empty: set key, text, pointer_move, button or scroll")
}

// scroll appends clicks of buttons 5 (down) or 4 (up), then 7 (right) or
// 6 (left).
func (d *Display) scroll(fakes []fakeEvent, dx, dy int32) ([]fakeEvent, error) {
	if dx < -MaxScrollSteps || dx > MaxScrollSteps || dy < -MaxScrollSteps || dy > MaxScrollSteps {
		return nil, invalidInput("scroll %d,%d: at most %d steps each way", dx, dy, MaxScrollSteps)
	}
	if dx != 0 && d.input.buttons < 7 {
		return nil, invalidInput("scroll dx: the pointer has no buttons 6 and 7")
	}
	steps := func(n int32, neg, pos byte) {
		b := pos
		if n < 0 {
			b, n = neg, -n
		}
		for range n {
			fakes = pressEvents(fakes, xproto.ButtonPress, b, nil)
		}
	}
	steps(dy, 4, 5)
	steps(dx, 6, 7)
	return fakes, nil
}

// pressEvents appends a press (down true), a release (false) or both
// (nil) of a key or button; press is KeyPress or ButtonPress, whose
// release is the next event type.
func pressEvents(fakes []fakeEvent, press, detail byte, down *bool) []fakeEvent {
	if down == nil || *down {
		fakes = append(fakes, fakeEvent{kind: press, detail: detail})
	}
	if down == nil || !*down {
		fakes = append(fakes, fakeEvent{kind: press + 1, detail: detail})
	}
	return fakes
}

// parseKeysym returns the keysym a KeyInput names: an X keysym name, a
// code point as U+XXXX, a keysym value as 0x hexadecimal, or a single
// character.
func parseKeysym(name string) (uint32, error) {
	if ks, ok := namedKeysyms[name]; ok {
		return ks, nil
	}
	if hex, ok := strings.CutPrefix(name, "U+"); ok {
		r, err := strconv.ParseUint(hex, 16, 32)
		if err != nil || r > utf8.MaxRune || len(hex) < 4 {
			return 0, invalidInput("keysym %q: U+ takes a code point of 4 to 6 hexadecimal digits", name)
		}
		return runeKeysym(rune(r)), nil
	}
	if hex, ok := strings.CutPrefix(name, "0x"); ok {
		v, err := strconv.ParseUint(hex, 16, 32)
		if err != nil || v == 0 || v > 0x1fffffff {
			return 0, invalidInput("keysym %q: 0x takes a keysym value of 1 to 0x1fffffff", name)
		}
		return uint32(v), nil
	}
	if r, size := utf8.DecodeRuneInString(name); size == len(name) && r != utf8.RuneError && r >= 0x20 && r != 0x7f {
		return runeKeysym(r), nil
	}
	return 0, invalidInput("keysym %q is not a keysym name, a single character, U+XXXX or 0x hexadecimal", name)
}

// textKeysym returns the keysym that types r: Return for a newline, Tab
// for a tab; other control characters cannot be typed.
func textKeysym(r rune) (uint32, error) {
	switch {
	case r == '\n':
		return namedKeysyms["Return"], nil
	case r == '\t':
		return namedKeysyms["Tab"], nil
	case r < 0x20 || (r >= 0x7f && r < 0xa0):
		return 0, invalidInput("text holds the control character U+%04X, which has no key (only \\n and \\t do)", r)
	}
	return runeKeysym(r), nil
}

// runeKeysym returns the keysym of a character: its code point for
// Latin-1, else the Unicode keysym 0x01000000 + code point.
func runeKeysym(r rune) uint32 {
	if (r >= 0x20 && r <= 0x7e) || (r >= 0xa0 && r <= 0xff) {
		return uint32(r)
	}
	return 0x01000000 | uint32(r)
}

// keymap is the X server's keyboard map: per keysyms for each keycode
// from min on.
type keymap struct {
	min  xproto.Keycode
	per  int
	syms []xproto.Keysym
}

func loadKeymap(conn *xgb.Conn) (*keymap, error) {
	setup := xproto.Setup(conn)
	lo, hi := setup.MinKeycode, setup.MaxKeycode
	m, err := xproto.GetKeyboardMapping(conn, lo, byte(hi-lo+1)).Reply()
	if err != nil {
		return nil, displayError(err)
	}
	if m.KeysymsPerKeycode == 0 {
		return nil, fmt.Errorf("%w: the keyboard map is empty", ErrDisplay)
	}
	return &keymap{min: lo, per: int(m.KeysymsPerKeycode), syms: m.Keysyms}, nil
}

// codes returns the number of keycodes of the map.
func (k *keymap) codes() int { return len(k.syms) / k.per }

// column returns the keysym of keycode i (counted from min) at column c.
func (k *keymap) column(i, c int) xproto.Keysym { return k.syms[i*k.per+c] }

// find returns the keycode whose first (unshifted) or, when shifted may,
// second (shifted) column holds ks.
func (k *keymap) find(ks uint32, shifted bool) (xproto.Keycode, bool, bool) {
	for c := range min(k.per, 2) {
		if c == 1 && !shifted {
			break
		}
		for i := range k.codes() {
			if uint32(k.column(i, c)) == ks {
				return k.min + xproto.Keycode(i), c == 1, true
			}
		}
	}
	return 0, false, false
}

// empty reports whether keycode i (counted from min) has no keysym.
func (k *keymap) empty(i int) bool {
	for c := range k.per {
		if k.column(i, c) != 0 {
			return false
		}
	}
	return true
}

// key is how a keysym is typed: its keycode, with Shift (shift is Shift's
// keycode) or not.
type key struct {
	code  xproto.Keycode
	shift xproto.Keycode // 0: no Shift
}

// events appends a press, release or both (see pressEvents) of k, with
// Shift held around it when it needs Shift.
func (k key) events(fakes []fakeEvent, down *bool) []fakeEvent {
	if k.shift != 0 && (down == nil || *down) {
		fakes = append(fakes, fakeEvent{kind: xproto.KeyPress, detail: byte(k.shift)})
	}
	fakes = pressEvents(fakes, xproto.KeyPress, byte(k.code), down)
	if k.shift != 0 && (down == nil || !*down) {
		fakes = append(fakes, fakeEvent{kind: xproto.KeyRelease, detail: byte(k.shift)})
	}
	return fakes
}

// planner finds the keys of one batch's keysyms, giving keysyms the map
// lacks spare keycodes.
type planner struct {
	km     *keymap
	shift  xproto.Keycode // Shift_L's keycode; 0 if the map has none
	spares []xproto.Keycode
	used   map[xproto.Keycode]bool // keycodes this batch types
	remaps []remap
}

// remap gives keycode the keysym, unshifted and shifted.
type remap struct {
	keycode xproto.Keycode
	keysym  uint32
}

// newPlanner returns a planner over km. Its spare keycodes are the empty
// ones, then those in remapped (least recently given first).
func newPlanner(km *keymap, remapped []xproto.Keycode) *planner {
	p := &planner{km: km, used: map[xproto.Keycode]bool{}}
	if code, shifted, ok := km.find(namedKeysyms["Shift_L"], false); ok && !shifted {
		p.shift = code
	}
	for i := range km.codes() {
		if km.empty(i) {
			p.spares = append(p.spares, km.min+xproto.Keycode(i))
		}
	}
	for _, code := range remapped {
		if !slices.Contains(p.spares, code) {
			p.spares = append(p.spares, code)
		}
	}
	return p
}

// key returns how ks is typed, giving it the next spare keycode this batch
// does not type when the map lacks it.
func (p *planner) key(ks uint32) (key, error) {
	if code, shifted, ok := p.km.find(ks, p.shift != 0); ok {
		p.used[code] = true
		k := key{code: code}
		if shifted {
			k.shift = p.shift
		}
		return k, nil
	}
	i := slices.IndexFunc(p.spares, func(c xproto.Keycode) bool { return !p.used[c] })
	if i < 0 {
		return key{}, invalidInput("keysym 0x%x is not on the keyboard map, and this batch already gave every spare key another keysym: send it in a batch of its own", ks)
	}
	code := p.spares[i]
	p.spares = slices.Delete(p.spares, i, i+1)
	p.used[code] = true
	p.remaps = append(p.remaps, remap{keycode: code, keysym: ks})
	// Later lookups of this batch see the map as it will be.
	row := int(code - p.km.min)
	for c := range p.km.per {
		p.km.syms[row*p.km.per+c] = 0
	}
	p.km.syms[row*p.km.per] = xproto.Keysym(ks)
	return key{code: code}, nil
}
