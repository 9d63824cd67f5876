package cli

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkCpRecursive copies a tree of 64 MiB (256 files of 256 KiB in 16
// directories) and of 1,000 files of 1 KiB into a Workspace with
// `ws cp -r` and back, against a single file of 64 MiB with `ws cp`:
//
//	go test -run - -bench CpRecursive -benchtime 3x ./internal/cli
func BenchmarkCpRecursive(b *testing.B) {
	e := newUpEnv(b)
	id := e.createWorkspace(b, "--wait", "--cpu", "1000", "--memory", "512Mi", "--disk", "1Gi").GetWorkspaceId()
	big, small := b.TempDir(), b.TempDir()
	for i := range 256 {
		writeRandom(b, filepath.Join(big, fmt.Sprintf("d%02d", i%16), fmt.Sprintf("f%03d", i)), 256<<10)
	}
	for i := range 1000 {
		writeRandom(b, filepath.Join(small, fmt.Sprintf("d%02d", i%10), fmt.Sprintf("f%04d", i)), 1<<10)
	}
	single := filepath.Join(b.TempDir(), "single")
	writeRandom(b, single, 64<<20)

	run := func(b *testing.B, bytes int64, args ...string) {
		b.SetBytes(bytes)
		for b.Loop() {
			if _, stderr, err := e.runData(b, "", args...); err != nil {
				b.Fatalf("%v: %v\n%s", args, err, stderr)
			}
		}
	}
	for _, c := range []struct {
		name  string
		src   string
		bytes int64
		flags []string
	}{
		{"Tree64MiB", big, 64 << 20, []string{"-r"}},
		{"Files1000x1KiB", small, 1000 << 10, []string{"-r"}},
		{"File64MiB", single, 64 << 20, nil},
	} {
		remote := id + ":/work/" + c.name
		b.Run(c.name+"/Up", func(b *testing.B) {
			run(b, c.bytes, append(append([]string{"ws", "cp"}, c.flags...), c.src, remote)...)
		})
		b.Run(c.name+"/Down", func(b *testing.B) {
			dst := b.TempDir()
			b.SetBytes(c.bytes)
			for i := 0; b.Loop(); i++ {
				args := append(append([]string{"ws", "cp"}, c.flags...), remote, filepath.Join(dst, fmt.Sprint(i)))
				if _, stderr, err := e.runData(b, "", args...); err != nil {
					b.Fatalf("%v: %v\n%s", args, err, stderr)
				}
			}
		})
	}
}

func writeRandom(b *testing.B, name string, size int) {
	b.Helper()
	data := make([]byte, size)
	rand.Read(data)
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(name, data, 0o644); err != nil {
		b.Fatal(err)
	}
}
