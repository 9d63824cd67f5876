package cli

import (
	"bytes"
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
