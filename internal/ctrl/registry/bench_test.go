package registry_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kibotos/kibotos/internal/ctrl/registry"
	"github.com/kibotos/kibotos/internal/imagestore"
	"github.com/kibotos/kibotos/internal/testutil/registrytest"
)

// BenchmarkPullImport pulls a 64 MiB image (4 random layers of 16 MiB)
// from a loopback registry with auth and imports it into an empty image
// store, every blob verified; Archive imports the same image from a
// docker archive on disk, for comparison:
//
//	go test -run - -bench PullImport -benchtime 5x ./internal/ctrl/registry
func BenchmarkPullImport(b *testing.B) {
	host := registrytest.Start(b, true)
	img := randomImageOf(b, 16<<20, 4)
	push(b, host+"/big:1", img)
	ctx := context.Background()
	b.Run("Registry", func(b *testing.B) { benchPull(b, ctx, host) })
	b.Run("Archive", func(b *testing.B) {
		archive := filepath.Join(b.TempDir(), "image.tar")
		if err := tarball.WriteToFile(archive, name.MustParseReference("example.com/big:1"), img); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(64 << 20)
		for b.Loop() {
			store, err := imagestore.Open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			if _, err := store.ImportArchiveFile(ctx, archive); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func benchPull(b *testing.B, ctx context.Context, host string) {
	p := &registry.Puller{Check: loopbackOnly, Insecure: []string{host}}
	b.SetBytes(64 << 20)
	for b.Loop() {
		store, err := imagestore.Open(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		remote, err := p.Pull(ctx, host+"/big:1", registry.DefaultPlatform, registry.Credentials{Username: user, Password: password})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := store.ImportImage(ctx, remote); err != nil {
			b.Fatal(err)
		}
	}
}
