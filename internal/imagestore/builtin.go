package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// DefaultBusybox is where Debian's busybox-static installs its binary.
const DefaultBusybox = "/bin/busybox"

// BuiltinImage builds the default template of a fresh deployment, without network:
// one layer with the static busybox at busyboxPath as /bin/busybox, a symlink
// /bin/<applet> -> busybox for every applet it lists, a minimal /etc (passwd, group,
// empty hostname) and the usual top-level directories; Cmd /bin/sh, linux/amd64.
//
// The image is deterministic: the same busybox binary gives the same manifest digest
// (entries sorted, every time Unix 0). busyboxPath must be a static linux/amd64 busybox:
// it is run with --list to learn its applets.
func BuiltinImage(busyboxPath string) (v1.Image, error) {
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("builtin image: %w", err)
	}
	applets, err := busyboxApplets(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("builtin image: %w", err)
	}
	layerTar, err := builtinTar(bin, applets)
	if err != nil {
		return nil, fmt.Errorf("builtin image: %w", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("builtin image: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, fmt.Errorf("builtin image: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("builtin image: %w", err)
	}
	epoch := v1.Time{Time: time.Unix(0, 0).UTC()}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = epoch
	cf.Config = v1.Config{
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Cmd: []string{"/bin/sh"},
	}
	cf.History = []v1.History{{Created: epoch, CreatedBy: "kibotos builtin template (busybox)"}}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("builtin image: %w", err)
	}
	return img, nil
}

// busyboxApplets runs busybox --list and returns the applet names, sorted.
func busyboxApplets(busyboxPath string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, busyboxPath, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busyboxPath, err)
	}
	var applets []string
	for _, name := range strings.Fields(string(out)) {
		if name == "busybox" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
			continue
		}
		applets = append(applets, name)
	}
	if len(applets) == 0 {
		return nil, fmt.Errorf("%s --list printed no applets", busyboxPath)
	}
	sort.Strings(applets)
	return applets, nil
}

// builtinTar returns the builtin layer as an uncompressed tar, entries sorted by name.
func builtinTar(busybox []byte, applets []string) ([]byte, error) {
	type entry struct {
		hdr  tar.Header
		data []byte
	}
	dir := func(name string, mode int64) entry {
		return entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}}
	}
	file := func(name string, mode int64, data []byte) entry {
		return entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}, data: data}
	}
	entries := []entry{
		dir("bin", 0o755), dir("dev", 0o755), dir("etc", 0o755), dir("home", 0o755),
		dir("proc", 0o555), dir("root", 0o700), dir("run", 0o755), dir("sys", 0o555),
		dir("tmp", 0o1777), dir("var", 0o755),
		file("bin/busybox", 0o755, busybox),
		file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")),
		file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")),
		file("etc/hostname", 0o644, nil),
	}
	for _, a := range applets {
		entries = append(entries, entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].hdr.Name < entries[j].hdr.Name })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.hdr
		h.ModTime = time.Unix(0, 0)
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
