package guestabi

import (
	"strings"
	"testing"
)

func TestCheckVolumePath(t *testing.T) {
	long := "/" + strings.Repeat("n", 255)
	for _, p := range []string{"/data", "/srv/data", "/home/user/work", "/etc2", "/tmpdata", "/etc/app", "/runner", long, "/a" + strings.Repeat("/"+strings.Repeat("x", 200), 20)} {
		if err := CheckVolumePath(p); err != nil {
			t.Errorf("CheckVolumePath(%.60q): %v", p, err)
		}
	}
	for _, p := range []string{
		"", "data", "/", "/data/", "/a/../b", // not clean and absolute
		"/a\x00b",  // no path
		long + "n", // a name too long
		"/a" + strings.Repeat("/"+strings.Repeat("x", 200), 21), // a path too long
		"/proc", "/dev/shm", "/sys/x", "/tmp", "/tmp/x", "/run", "/run/x", "/run/kibotos/x", "/etc", "/etc/hosts", "/.kibotos", // the platform's
	} {
		if err := CheckVolumePath(p); err == nil {
			t.Errorf("CheckVolumePath(%.60q) accepted it", p)
		}
	}
}
