package guestabi

import "testing"

func TestParseDisplaySize(t *testing.T) {
	for in, want := range map[string]DisplaySize{
		"1280x800": {1280, 800}, "64x64": {64, 64}, "8192x8192": {8192, 8192},
	} {
		got, err := ParseDisplaySize(in)
		if err != nil || got != want {
			t.Errorf("ParseDisplaySize(%q) = %v, %v; want %v", in, got, err, want)
		}
		if got.String() != in {
			t.Errorf("%v prints as %q, want %q", got, got.String(), in)
		}
	}
	if got := (DisplaySize{1280, 800}).Arg(); got != "--display=1280x800" {
		t.Errorf("Arg() = %q", got)
	}
	for _, in := range []string{"", "1280", "1280x", "x800", "1280X800", "63x800", "1280x8193", "-1x800", "+1280x800", "1280x800x24", " 1280x800"} {
		if _, err := ParseDisplaySize(in); err == nil {
			t.Errorf("ParseDisplaySize(%q) succeeded", in)
		}
	}
}
