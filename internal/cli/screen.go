package cli

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/sdk"
)

func wsScreenshotCommand(c *conn) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "screenshot ID -o FILE",
		Short: "Capture the screen of a Workspace that has a display as a PNG file",
		Long: "Capture the whole screen of a Workspace whose template carries a display (such as the\n" +
			"built-in desktop) and write it as PNG to FILE (-o - writes it to stdout). It prints the\n" +
			"screen's size. A Workspace without a display fails with failed_precondition.",
		Args: cobra.ExactArgs(1),
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		// For this verb -o names the file, not a format.
		if !cmd.Flags().Changed("output") {
			return errors.New("name the file to write with -o FILE (- for stdout)")
		}
		file := c.output
		c.output = outputTable
		ws, closeIdle, err := openWorkspace(cmd, c, args[0])
		if err != nil {
			return err
		}
		defer closeIdle()
		shot, err := ws.Screenshot(cmd.Context())
		if err != nil {
			return err
		}
		if file == "-" {
			_, err := cmd.OutOrStdout().Write(shot.GetPng())
			return err
		}
		if err := os.WriteFile(file, shot.GetPng(), 0o644); err != nil {
			return err
		}
		_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: %dx%d\n", file, shot.GetWidth(), shot.GetHeight())
		return err
	}
	return cmd
}

func wsInputCommand(c *conn) *cobra.Command {
	var events []*datav1.InputEvent
	cmd := &cobra.Command{
		Use:   "input ID [--type TEXT] [--key KEYSYM[+KEYSYM...]] [--click X,Y] ...",
		Short: "Send keyboard and pointer input to a Workspace that has a display",
		Long: "Send keyboard and pointer input to the display of a Workspace whose template carries one\n" +
			"(such as the built-in desktop), in the order the flags are given, as one batch: nothing is\n" +
			"sent when any of it is invalid. Keys are X keysym names (Return, Tab, BackSpace, Escape,\n" +
			"Control_L, Alt_L, Super_L, F1, Left, Page_Down, a, A, exclam, ...), single characters, or\n" +
			"U+XXXX. Coordinates are pixels from the screen's top-left corner.\n\n" +
			"  kibotos ws input WS --click 100,200 --type 'hello' --key Return\n" +
			"  kibotos ws input WS --key Control_L+Alt_L+t          # a chord: hold, strike, release",
		Args: cobra.ExactArgs(1),
	}
	f := cmd.Flags()
	add := func(name, arg, usage string, parse func(string) ([]*datav1.InputEvent, error)) {
		f.Var(&inputFlag{arg: arg, parse: parse, events: &events}, name, usage)
	}
	add("type", "TEXT", "type TEXT, one keystroke per character (a newline is Return)", func(s string) ([]*datav1.InputEvent, error) {
		return []*datav1.InputEvent{sdk.Type(s)}, nil
	})
	add("key", "KEYSYM", "strike a key; KEY+KEY+... holds all but the last down while striking the last (plus names the + key)", parseChord)
	add("key-down", "KEYSYM", "press a key and hold it", func(s string) ([]*datav1.InputEvent, error) {
		return []*datav1.InputEvent{sdk.KeyDown(s)}, nil
	})
	add("key-up", "KEYSYM", "release a key", func(s string) ([]*datav1.InputEvent, error) {
		return []*datav1.InputEvent{sdk.KeyUp(s)}, nil
	})
	add("move", "X,Y", "move the pointer to X,Y", func(s string) ([]*datav1.InputEvent, error) {
		x, y, err := parsePair[uint32](s)
		return []*datav1.InputEvent{sdk.MoveTo(x, y)}, err
	})
	add("click", "X,Y", "move the pointer to X,Y and click the left button", func(s string) ([]*datav1.InputEvent, error) {
		x, y, err := parsePair[uint32](s)
		return []*datav1.InputEvent{sdk.MoveTo(x, y), sdk.Button(1)}, err
	})
	add("button", "N", "click button N where the pointer is (1 left, 2 middle, 3 right)", func(s string) ([]*datav1.InputEvent, error) {
		b, err := strconv.ParseUint(s, 10, 32)
		return []*datav1.InputEvent{sdk.Button(uint32(b))}, err
	})
	add("scroll", "DX,DY", "scroll where the pointer is by wheel steps: DY down when positive, up when negative; DX right or left", func(s string) ([]*datav1.InputEvent, error) {
		dx, dy, err := parsePair[int32](s)
		return []*datav1.InputEvent{sdk.Scroll(dx, dy)}, err
	})
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if len(events) == 0 {
			return errors.New("nothing to send: give --type, --key, --key-down, --key-up, --move, --click, --button or --scroll")
		}
		ws, closeIdle, err := openWorkspace(cmd, c, args[0])
		if err != nil {
			return err
		}
		defer closeIdle()
		return ws.Input(cmd.Context(), events...)
	}
	return cmd
}

// inputFlag is a flag of ws input: each use appends its events to one
// list, so the list keeps the order of the command line.
type inputFlag struct {
	arg    string
	parse  func(string) ([]*datav1.InputEvent, error)
	events *[]*datav1.InputEvent
}

func (f *inputFlag) String() string { return "" }
func (f *inputFlag) Type() string   { return f.arg }

func (f *inputFlag) Set(s string) error {
	evs, err := f.parse(s)
	if err != nil {
		return fmt.Errorf("want %s", f.arg)
	}
	*f.events = append(*f.events, evs...)
	return nil
}

// parseChord reads KEYSYM or KEYSYM+KEYSYM+...: the keys of a chord.
func parseChord(s string) ([]*datav1.InputEvent, error) {
	if s == "+" || !strings.Contains(s, "+") {
		return []*datav1.InputEvent{sdk.Key(s)}, nil
	}
	var keys []string
	parts := strings.Split(s, "+")
	for i := 0; i < len(parts); i++ {
		k := parts[i]
		if k == "U" && i+1 < len(parts) && isHex(parts[i+1]) {
			i++
			k += "+" + parts[i] // a keysym by code point, U+20AC
		}
		if k == "" {
			return nil, errors.New("empty key in chord")
		}
		keys = append(keys, k)
	}
	if len(keys) == 1 {
		return []*datav1.InputEvent{sdk.Key(keys[0])}, nil
	}
	return sdk.Chord(keys...), nil
}

// isHex reports whether s is a non-empty run of hexadecimal digits.
func isHex(s string) bool {
	return s != "" && strings.Trim(s, "0123456789abcdefABCDEF") == ""
}

// parsePair reads "A,B" as two integers.
func parsePair[T uint32 | int32](s string) (T, T, error) {
	a, b, ok := strings.Cut(s, ",")
	signed := T(0)-1 < 0
	parse := func(v string) (T, error) {
		if signed {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
			return T(n), err
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		return T(n), err
	}
	x, xerr := parse(a)
	y, yerr := parse(b)
	if !ok || xerr != nil || yerr != nil {
		return 0, 0, errors.New("want two integers A,B")
	}
	return x, y, nil
}
