package sparsefile

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriter writes files in writes of sizes that do not follow its
// blocks: each reads back as written, blocks of zeros take no room, and a
// file that ends in zeros (or is only zeros, or empty) has its full size.
func TestWriter(t *testing.T) {
	const holeBlock = 64 << 10          // sizes of the data, several of the Writer's blocks
	data := func(parts ...any) []byte { // alternating zero runs (int) and data (string)
		var b []byte
		for _, p := range parts {
			switch p := p.(type) {
			case int:
				b = append(b, make([]byte, p)...)
			case string:
				b = append(b, p...)
			}
		}
		return b
	}
	for _, tc := range []struct {
		name    string
		data    []byte
		maxUsed int64 // bytes of blocks, at most
	}{
		{"empty", nil, 0},
		{"small", data("hello"), 4096},
		{"zeros", data(10 * holeBlock), 0},
		{"short zeros", data(100), 0},
		{"data, hole, data", data("a", 8*holeBlock, "z"), 4 * holeBlock},
		{"hole then a byte", data(16*holeBlock-1, "x"), 2 * holeBlock},
		{"ends in a hole", data("a", 16*holeBlock+7), 2 * holeBlock},
		{"zeros within a block", data("a", holeBlock-2, "b", 3*holeBlock), 3 * holeBlock},
	} {
		for _, chunk := range []int{1000, holeBlock, 3*holeBlock + 5} {
			name := filepath.Join(t.TempDir(), "f")
			f, err := os.Create(name)
			if err != nil {
				t.Fatal(err)
			}
			w := NewWriter(f)
			for rest := tc.data; len(rest) > 0; {
				n, err := w.Write(rest[:min(chunk, len(rest))])
				if err != nil {
					t.Fatal(err)
				}
				rest = rest[n:]
			}
			if err := w.Finish(); err != nil {
				t.Fatal(err)
			}
			var st syscall.Stat_t
			if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
				t.Fatal(err)
			}
			f.Close()
			got, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.data) {
				t.Errorf("%s in writes of %d: %d bytes read back differ from the %d written", tc.name, chunk, len(got), len(tc.data))
			}
			if st.Blocks*512 > tc.maxUsed {
				t.Errorf("%s in writes of %d: %d bytes of blocks, want at most %d", tc.name, chunk, st.Blocks*512, tc.maxUsed)
			}
		}
	}
}
