package mountinfo

import (
	"testing"
)

// The fields of mountinfo lines: the mount point (fifth) and the source
// (second after the separator), with or without optional fields.
func TestFields(t *testing.T) {
	for _, c := range []struct{ line, mountPoint, source string }{
		{`36 35 98:0 /mnt1 /mnt/a\040b rw,noatime master:1 - ext3 /dev/root rw`, `/mnt/a\040b`, "/dev/root"},
		{`36 35 98:0 / /mnt rw - tmpfs tmpfs rw`, "/mnt", "tmpfs"},
		{`36 35 98:0 / /`, "/", ""},
		{`36 35 98:0 /`, "", ""},
		{`36 35 98:0 / /x rw - ext4`, "/x", ""},
		{``, "", ""},
	} {
		mp, ok := MountPoint([]byte(c.line))
		if string(mp) != c.mountPoint || ok != (c.mountPoint != "") {
			t.Errorf("MountPoint(%q) = %q, %v; want %q", c.line, mp, ok, c.mountPoint)
		}
		src, ok := Source([]byte(c.line))
		if string(src) != c.source || ok != (c.source != "") {
			t.Errorf("Source(%q) = %q, %v; want %q", c.line, src, ok, c.source)
		}
	}
}

func TestEscape(t *testing.T) {
	if got := Escape("/a b\t\n\\c"); got != `/a\040b\011\012\134c` {
		t.Errorf("Escape = %q", got)
	}
	if got := Unescape(Escape("/a b\\c")); got != "/a b\\c" {
		t.Errorf("Unescape(Escape) = %q", got)
	}
	if got := Unescape(`/a\04`); got != `/a\04` {
		t.Errorf("Unescape of a short escape = %q, want it kept", got)
	}
}

// Scan reads this process's table: the root is mounted.
func TestScanFindsTheRoot(t *testing.T) {
	root := false
	if err := Scan(func(line []byte) {
		if mp, ok := MountPoint(line); ok && string(mp) == "/" {
			root = true
		}
	}); err != nil {
		t.Fatal(err)
	}
	if !root {
		t.Error("no mount of / in /proc/self/mountinfo")
	}
}
