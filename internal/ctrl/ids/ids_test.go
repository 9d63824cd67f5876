package ids

import (
	"strings"
	"testing"
)

func TestNewIsPrefixedUniqueAndOrdered(t *testing.T) {
	prev := ""
	seen := map[string]bool{}
	for range 1000 {
		id := New("egr")
		if !strings.HasPrefix(id, "egr_") || len(id) != len("egr_")+26 {
			t.Fatalf("malformed id %q", id)
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
		if id <= prev {
			t.Fatalf("id %q does not sort after %q", id, prev)
		}
		prev = id
	}
}
