package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestImportFence keeps the guest agent small: only the standard library,
// golang.org/x/sys and this module's own packages may be linked in, and it
// must build without cgo.
func TestImportFence(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(p, "github.com/kibotos/kibotos/"),
			p == "golang.org/x/sys" || strings.HasPrefix(p, "golang.org/x/sys/"):
		default:
			t.Errorf("kibotos-guest depends on %s: only the standard library and golang.org/x/sys are allowed", p)
		}
	}
}
