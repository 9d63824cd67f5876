package bearer

import "testing"

func TestParse(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer tok":     "tok",
		"bearer tok":     "tok",
		"BEARER  tok ":   "tok",
		"Bearer":         "",
		"Bearer ":        "",
		"Basic dXNlcjpw": "",
		"Bearertok":      "",
		"":               "",
		"Token tok":      "",
	} {
		got, ok := Parse(header)
		if got != want || ok != (want != "") {
			t.Errorf("Parse(%q) = %q, %v; want %q", header, got, ok, want)
		}
	}
}
