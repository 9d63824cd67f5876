package imagestore

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/kibotos/kibotos/internal/guestabi"
)

// DesktopCacheDir is where a deployment keeps the desktop image it built,
// across deployments and their homes.
const DesktopCacheDir = "/var/cache/kibotos"

// DesktopDisplay is the screen of the desktop image.
var DesktopDisplay = guestabi.DisplaySize{Width: 1280, Height: 800}

// desktopPackages are the Debian packages of the desktop image beyond
// minbase: the X server, a window manager (openbox, whose session is the
// image's x-session-manager) with a panel, a terminal, a browser, the
// fonts they draw with, and the X utilities (xwininfo, xprop, xsetroot,
// xrandr, ...).
var desktopPackages = []string{"xvfb", "openbox", "tint2", "xterm", "chromium", "xfonts-base", "fonts-dejavu-core",
	"x11-utils", "x11-xserver-utils"}

// desktopHooks adjust the installed system (mmdebstrap's customize hooks,
// run with the root directory as $1): Ctrl+Alt+T opens a terminal in
// openbox, the session paints the background and starts the panel, and
// chromium runs as root without its sandbox, which needs user namespaces
// that guests do not have.
var desktopHooks = []string{
	`sed -i 's|<keyboard>|<keyboard><keybind key="C-A-t"><action name="Execute"><command>x-terminal-emulator</command></action></keybind>|' "$1/etc/xdg/openbox/rc.xml"`,
	`grep -q 'key="C-A-t"' "$1/etc/xdg/openbox/rc.xml"`,
	`printf '%s\n' "xsetroot -solid '#30475e'" 'tint2 &' >> "$1/etc/xdg/openbox/autostart"`,
	`echo 'export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-sandbox --no-first-run"' > "$1/etc/chromium.d/kibotos"`,
}

// desktopArgs are mmdebstrap's arguments but the target: Debian 12
// (bookworm with its updates and security updates) from deb.debian.org,
// minbase and desktopPackages, without documentation, manual pages and
// translations, then desktopHooks.
func desktopArgs() []string {
	args := []string{"--variant=minbase", "--format=tar", "--include=" + strings.Join(desktopPackages, ","),
		"--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/info/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*"}
	for _, h := range desktopHooks {
		args = append(args, "--customize-hook="+h)
	}
	return append(args, "bookworm", "-",
		"deb http://deb.debian.org/debian bookworm main",
		"deb http://deb.debian.org/debian bookworm-updates main",
		"deb http://deb.debian.org/debian-security bookworm-security main")
}

// DesktopImageDir returns the directory under cacheDir that holds the
// desktop image built from the current recipe, as an OCI image layout. Its
// name carries a hash of the recipe (mmdebstrap's arguments and the image
// config), so a changed recipe builds anew.
func DesktopImageDir(cacheDir string) string {
	h := sha256.New()
	for _, a := range desktopArgs() {
		fmt.Fprintf(h, "%q\n", a)
	}
	fmt.Fprintf(h, "%+v\n", desktopConfig())
	return filepath.Join(cacheDir, fmt.Sprintf("desktop-%x", h.Sum(nil)[:8]))
}

// desktopConfig is the desktop image's config: linux/amd64, the display
// label, a UTF-8 locale, bash.
func desktopConfig() v1.Config {
	return v1.Config{
		Env:    []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
		Cmd:    []string{"/bin/bash"},
		Labels: map[string]string{guestabi.DisplayLabel: DesktopDisplay.String()},
	}
}

// DesktopImage returns the desktop image built in cacheDir, or an error
// satisfying errors.Is(err, os.ErrNotExist) when none is.
func DesktopImage(cacheDir string) (v1.Image, error) {
	dir := DesktopImageDir(cacheDir)
	if !built(dir) {
		return nil, fmt.Errorf("desktop image %s: %w", dir, os.ErrNotExist)
	}
	return layoutImage(dir)
}

// BuildDesktopImage builds the desktop image into DesktopImageDir unless
// it is there, and returns that directory. mmdebstrap (run as root, with
// Debian's mirror reachable) makes the root filesystem, whose tar becomes
// the image's one layer (device nodes left out: the runtime makes /dev);
// its progress goes to log. Builders of one cache directory take turns
// (a lock file beside the image), so a second waits for the first's
// image. On error nothing is left but the lock file.
func BuildDesktopImage(ctx context.Context, cacheDir string, log io.Writer) (string, error) {
	dir := DesktopImageDir(cacheDir)
	if built(dir) {
		return dir, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(ctx, dir+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if built(dir) {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(cacheDir, filepath.Base(dir)+".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	layerPath := filepath.Join(tmp, "layer.tar.gz")
	if err := mmdebstrap(ctx, tmp, layerPath, log); err != nil {
		return "", fmt.Errorf("building the desktop image: %w", err)
	}
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return "", err
	}
	img, err := desktopImage(layer)
	if err != nil {
		return "", err
	}
	p, err := layout.Write(filepath.Join(tmp, "layout"), empty.Index)
	if err != nil {
		return "", err
	}
	if err := p.AppendImage(img); err != nil {
		return "", fmt.Errorf("writing the desktop image: %w", err)
	}
	if err := os.Rename(filepath.Join(tmp, "layout"), dir); err != nil {
		return "", err
	}
	removeStaleDesktops(cacheDir, dir)
	return dir, nil
}

// removeStaleDesktops removes the desktop images of earlier recipes from
// cacheDir, with their lock files, keeping current.
func removeStaleDesktops(cacheDir, current string) {
	old, _ := filepath.Glob(filepath.Join(cacheDir, "desktop-????????????????"))
	for _, d := range old {
		if d != current && built(d) {
			os.RemoveAll(d)
			os.Remove(d + ".lock")
		}
	}
}

// built reports whether dir holds a finished image layout (it appears by
// one rename).
func built(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "index.json"))
	return err == nil
}

// lockFile takes an exclusive lock on path, waiting while another holds
// it, and returns its release.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// mmdebstrap runs mmdebstrap (its temporary files under tmp) and writes
// its root filesystem to layerPath as a gzip-compressed layer.
func mmdebstrap(ctx context.Context, tmp, layerPath string, log io.Writer) error {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return fmt.Errorf("%w (scripts/install-deps installs it)", err)
	}
	cmd := exec.CommandContext(ctx, "mmdebstrap", desktopArgs()...)
	// Timestamps clamped to the epoch, and apt's files in the cache's
	// filesystem.
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH=0", "TMPDIR="+tmp)
	cmd.Stderr = log
	// Cancelled, mmdebstrap ends its apt and dpkg and removes its files.
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGTERM) }
	cmd.WaitDelay = time.Minute
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	convErr := writeLayer(out, layerPath)
	io.Copy(io.Discard, out) // let mmdebstrap finish after a failed conversion
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("mmdebstrap: %w", err)
	}
	return convErr
}

// writeLayer copies the tar r to a gzip-compressed layer file at path:
// names without their "./", no entry for the root itself, no device nodes.
func writeLayer(r io.Reader, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := bufio.NewWriterSize(f, 1<<20)
	zw, err := gzip.NewWriterLevel(buf, gzip.BestSpeed)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading the root filesystem: %w", err)
		}
		hdr.Name = strings.TrimPrefix(hdr.Name, "./")
		if hdr.Typeflag == tar.TypeLink {
			hdr.Linkname = strings.TrimPrefix(hdr.Linkname, "./")
		}
		if hdr.Name == "" || hdr.Typeflag == tar.TypeChar || hdr.Typeflag == tar.TypeBlock {
			continue
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	for _, c := range []io.Closer{tw, zw} {
		if err := c.Close(); err != nil {
			return err
		}
	}
	if err := buf.Flush(); err != nil {
		return err
	}
	return f.Close()
}

// desktopImage returns the image of one layer with desktopConfig.
func desktopImage(layer v1.Layer) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	epoch := v1.Time{Time: time.Unix(0, 0).UTC()}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = epoch
	cf.Config = desktopConfig()
	cf.History = []v1.History{{Created: epoch, CreatedBy: "kibotos desktop template (mmdebstrap " + strings.Join(desktopPackages, " ") + ")"}}
	return mutate.ConfigFile(img, cf)
}
