package fake

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kibotos/kibotos/internal/host/runtime"
)

var _ runtime.Binder = (*Driver)(nil)

// Bind hands a running execution to a workspace; see runtime.Binder. The
// layer image file is renamed; Spec then reports b's hostname, limits and
// layer image.
func (d *Driver) Bind(ctx context.Context, id string, b runtime.Binding) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	image, err := filepath.Abs(b.LayerImage)
	if err != nil {
		return err
	}
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	e, err := m.get(id)
	if err != nil {
		return err
	}
	if !e.running() {
		return fmt.Errorf("fake: execution %s does not run", id)
	}
	if _, err := os.Lstat(image); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("fake: layer image %s exists", image)
	}
	old := e.images[0]
	if err := os.Rename(old, image); err != nil {
		return err
	}
	delete(m.inUse, old)
	m.inUse[image] = id
	if m.reserved[old] {
		delete(m.reserved, old)
		m.reserved[image] = true
	}
	e.images[0] = image
	e.spec.LayerImage, e.spec.Hostname = image, b.Hostname
	e.spec.CPUMillis, e.spec.MemoryBytes, e.spec.PidsLimit = b.CPUMillis, b.MemoryBytes, b.PidsLimit
	e.memory = b.MemoryBytes
	return nil
}
