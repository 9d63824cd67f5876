package hostpaths

import "testing"

func TestReplace(t *testing.T) {
	names := map[string]string{"/var/lib/k/layers": "<layers>", "/var/lib/k/layers/ws_1.ext4": "<layer image>", "": "<nothing>"}
	for in, want := range map[string]string{
		"mount /var/lib/k/layers/ws_1.ext4 on /dev/loop12: busy":    "mount <layer image> on <loop device>: busy",
		"rmdir /sys/fs/cgroup/blkio/kibotos/ws_1-2: busy":           "rmdir <cgroups>/blkio/kibotos/ws_1-2: busy",
		"open /var/lib/k/layers/.mnt-ws_2/upper/x: name too long":   "open <layers>/.mnt-ws_2/upper/x: name too long",
		"the guest's own /lost+found is not a directory (no paths)": "the guest's own /lost+found is not a directory (no paths)",
	} {
		if got := Replace(in, names); got != want {
			t.Errorf("Replace(%q) = %q, want %q", in, got, want)
		}
	}
}
