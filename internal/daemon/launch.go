package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	hostv1 "github.com/kibotos/kibotos/gen/kibotos/host/v1"
	"github.com/kibotos/kibotos/internal/host/runtime/oci"
)

// hostLaunch is the exact launch this host runs executions with: its
// driver's platform and runtime version, the guest agent build at guest and
// the seccomp profile.
func hostLaunch(ctx context.Context, driver *oci.Driver, guest string) (*hostv1.Launch, error) {
	version, err := driver.RuntimeVersion(ctx)
	if err != nil {
		return nil, err
	}
	build, err := fileDigest(guest)
	if err != nil {
		return nil, fmt.Errorf("guest agent: %w", err)
	}
	return &hostv1.Launch{Platform: driver.Platform(), RuntimeVersion: version, GuestBuild: build,
		SeccompProfile: oci.SeccompDigest()}, nil
}

// fileDigest is sha256:<hex> of a file's content.
func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
