package imagestore

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
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

// BuiltinPrograms are host programs the built-in image carries, with the shared
// libraries they load, in place of busybox's applets of the same name: Debian's
// busybox wget crashes (its -T timeout segfaults), so wget is Debian's own
// (package wget, installed by scripts/install-deps). The CA bundle of package
// ca-certificates comes along for HTTPS.
var BuiltinPrograms = []string{"/usr/bin/wget"}

// caBundle is the CA certificates file of Debian's ca-certificates, which the
// built-in image carries when the host has it.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// BuiltinImage builds the default template of a fresh deployment, without network:
// one layer with the static busybox at busyboxPath as /bin/busybox, a symlink
// /bin/<applet> -> busybox for every applet it lists but those BuiltinPrograms
// replace, BuiltinPrograms with their shared libraries (as ldd lists them) and
// the host's CA bundle, a minimal /etc (passwd, group, empty hostname) and the
// usual top-level directories; Cmd /bin/sh, linux/amd64.
//
// The image is deterministic: the same host files give the same manifest digest
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
	files, err := hostFiles(BuiltinPrograms)
	if err != nil {
		return nil, fmt.Errorf("builtin image: %w (scripts/install-deps installs them)", err)
	}
	applets = slices.DeleteFunc(applets, func(a string) bool {
		return slices.ContainsFunc(BuiltinPrograms, func(p string) bool { return path.Base(p) == a })
	})
	layerTar, err := builtinTar(bin, applets, files)
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

// hostFile is a file copied from the host into the built-in image.
type hostFile struct {
	name string // path in the image, relative
	mode int64
	data []byte
}

// hostFiles reads programs, every shared library they load, and the CA bundle
// if the host has it, each at its path on the host.
func hostFiles(programs []string) ([]hostFile, error) {
	paths := map[string]bool{}
	for _, p := range programs {
		paths[p] = true
		libs, err := sharedLibraries(p)
		if err != nil {
			return nil, err
		}
		for _, l := range libs {
			paths[l] = true
		}
	}
	if _, err := os.Stat(caBundle); err == nil {
		paths[caBundle] = true
	}
	var out []hostFile
	for p := range paths {
		data, err := os.ReadFile(p) // through symlinks: the image holds the file itself
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		out = append(out, hostFile{name: strings.TrimPrefix(filepath.Clean(p), "/"), mode: int64(fi.Mode().Perm()), data: data})
	}
	return out, nil
}

// sharedLibraries returns the absolute paths of the shared libraries (the
// dynamic loader included) that ldd reports program loads.
func sharedLibraries(program string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ldd", program).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", program, err)
	}
	var libs []string
	for _, line := range strings.Split(string(out), "\n") {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vdso has no path.
		f := strings.Fields(line)
		if i := slices.Index(f, "=>"); i >= 0 {
			f = f[i+1:]
		}
		if len(f) > 0 && filepath.IsAbs(f[0]) {
			libs = append(libs, f[0])
		}
	}
	return libs, nil
}

// builtinTar returns the builtin layer as an uncompressed tar, entries sorted by name.
func builtinTar(busybox []byte, applets []string, files []hostFile) ([]byte, error) {
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
	dirs := map[string]bool{}
	for _, e := range entries {
		dirs[strings.TrimSuffix(e.hdr.Name, "/")] = e.hdr.Typeflag == tar.TypeDir
	}
	for _, f := range files {
		if _, dup := dirs[f.name]; dup {
			return nil, fmt.Errorf("host file /%s collides with the image's own", f.name)
		}
		entries = append(entries, file(f.name, f.mode, f.data))
		for d := path.Dir(f.name); d != "."; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = true
				entries = append(entries, dir(d, 0o755))
			}
		}
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
