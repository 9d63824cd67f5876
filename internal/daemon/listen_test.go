package daemon_test

import (
	"os"
	"strings"
	"testing"

	"github.com/kibotos/kibotos/internal/daemon"
)

// TestBadListenSetsUpNothing: an address that cannot be listened on is
// refused before anything of a new deployment is made (its home, store
// and admin token, shown once).
func TestBadListenSetsUpNothing(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1", "127.0.0.1:nosuchservice"} {
		home := t.TempDir()
		var out strings.Builder
		err := daemon.Run(t.Context(), daemon.Options{Home: home, Listen: addr, Out: &out})
		if err == nil || !strings.Contains(err.Error(), "--listen") {
			t.Errorf("--listen %s: %v", addr, err)
		}
		if entries, _ := os.ReadDir(home); len(entries) != 0 || out.Len() != 0 {
			t.Errorf("--listen %s left %d entries in the home and printed %q", addr, len(entries), out.String())
		}
	}
}
