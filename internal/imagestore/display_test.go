package imagestore

import (
	"context"
	"errors"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// withLabel returns img with the config label key=value.
func withLabel(t *testing.T, img v1.Image, key, value string) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Config.Labels = map[string]string{key: value}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestDisplayLabel(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	plain, err := s.ImportImage(ctx, testImage(t, "amd64", tarLayer(t, fileE("a", "a"))))
	if err != nil {
		t.Fatal(err)
	}
	if plain.Config.Display != nil {
		t.Errorf("an image without the label has display %v", plain.Config.Display)
	}
	img, err := s.ImportImage(ctx, withLabel(t, testImage(t, "amd64", tarLayer(t, fileE("b", "b"))), guestabi.DisplayLabel, "1280x800"))
	if err != nil {
		t.Fatal(err)
	}
	want := guestabi.DisplaySize{Width: 1280, Height: 800}
	if d := img.Config.Display; d == nil || *d != want {
		t.Errorf("imported display %v, want %v", d, want)
	}
	again, err := s.Image(img.ManifestDigest)
	if err != nil {
		t.Fatal(err)
	}
	if d := again.Config.Display; d == nil || *d != want {
		t.Errorf("stored display %v, want %v", d, want)
	}
	refused := openStore(t)
	for _, bad := range []string{"", "big", "1280x800x24", "10x10", "9000x800"} {
		_, err := refused.ImportImage(ctx, withLabel(t, testImage(t, "amd64", tarLayer(t, fileE("c", bad))), guestabi.DisplayLabel, bad))
		if !errors.Is(err, ErrInvalidImage) {
			t.Errorf("label %q: %v, want ErrInvalidImage", bad, err)
		}
	}
	assertClean(t, refused)
}
