package cli

import (
	"bytes"
	"strings"
	"testing"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// TestJSONIsStable: -o json prints the same bytes for the same message in
// every build, two spaces of indent and one after each colon, and the
// one-line form has no space at all outside strings; protojson varies its
// own whitespace from build to build.
func TestJSONIsStable(t *testing.T) {
	m := &ctrlv1.Workspace{WorkspaceId: "ws_x", Labels: map[string]string{"a": "b c"}}
	var out bytes.Buffer
	if err := writeJSON(&out, m); err != nil {
		t.Fatal(err)
	}
	if want := "{\n  \"workspaceId\": \"ws_x\",\n  \"labels\": {\n    \"a\": \"b c\"\n  }\n}\n"; out.String() != want {
		t.Errorf("-o json printed %q, want %q", out.String(), want)
	}
	line, err := marshalJSON(m, "")
	if want := `{"workspaceId":"ws_x","labels":{"a":"b c"}}`; err != nil || string(line) != want {
		t.Errorf("one line: %s, %v; want %s", line, err, want)
	}
}

// TestPrintableSteersNoTerminal: what a workspace chose, printed in a
// table or an error, reaches the terminal with its control characters
// escaped and its bytes that are not UTF-8 replaced, so that it cannot
// set the clipboard (OSC 52), the title, or clear the screen.
func TestPrintableSteersNoTerminal(t *testing.T) {
	for _, c := range []struct {
		in        string
		keepLines bool
		want      string
	}{
		{"plain name", false, "plain name"},
		{"\x1b]52;c;cm0gLXJmIH4K\a", false, `\x1b]52;c;cm0gLXJmIH4K\a`},
		{"a\tb\nc", false, `a\tb\nc`},
		{"a\tb\nc\x1b[2J", true, "a\tb\nc\\x1b[2J"},
		{"csi \x9b2J", false, "csi \uFFFD2J"},
		{"ünïcode ✓", false, "ünïcode ✓"},
	} {
		if got := printable(c.in, c.keepLines); got != c.want {
			t.Errorf("printable(%q, %v) = %q, want %q", c.in, c.keepLines, got, c.want)
		}
	}
	var out bytes.Buffer
	tbl := table[string]{header: []string{"COMMAND"}, row: func(s string) []string { return []string{s} }}
	if err := tbl.write(&out, []string{"sh -c \x1b]0;PWNED\a"}, false); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\a") {
		t.Errorf("a table wrote control characters: %q", out.String())
	}
}
