package cli

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/sparsefile"
	"github.com/kibotos/kibotos/internal/treemove"
	"github.com/kibotos/kibotos/sdk"
)

// `ws cp -r` copies a directory as one tar stream through a tar process in
// the guest (the file API writes no symlinks): `tar -c` in the directory
// for a download, `tar -x` into it for an upload, so the image needs a tar
// (busybox's or GNU's). The stream keeps permission bits, modification
// times and symlinks; owners are those of the user who extracts, and a
// download drops the setuid and setgid bits of files. Either
// side refuses what would land outside the destination: an entry named
// with .. or an absolute path, a symlink whose target is absolute or
// climbs out of the copy, an entry beneath a symlink of the copy.
// Either way the copy is extracted into a hidden directory and moved into
// place only when it is whole (treemove, or MoveFile with merge), so a
// refused, failed or cut copy leaves its destination as it was.

// stdinChunk is the most the SDK sends a process's stdin in one call.
const stdinChunk = 32 << 10

// errNeedsTar explains a guest without tar.
const errNeedsTar = "cp -r runs tar in the workspace: does its image have one?"

// isTree reports whether src is a directory (or a symlink to one).
func (cp *copier) isTree(src cpOperand) (bool, error) {
	if src.ws == "" {
		st, err := os.Stat(src.path)
		return err == nil && st.IsDir(), err
	}
	info, err := cp.statTarget(src.path)
	return err == nil && info.GetType() == datav1.FileType_FILE_TYPE_DIRECTORY, err
}

// copyTree copies the directory src to dst, one of them in the Workspace.
func (cp *copier) copyTree(src, dst cpOperand) error {
	if src.ws != "" {
		return cp.downloadTree(src.path, dst.path)
	}
	return cp.uploadTree(src.path, dst.path)
}

// treeTarget returns where a copy of the directory named base lands for
// DST: inside DST when DST is an existing directory, else DST itself.
func treeTarget(dst string, dstIsDir bool, base string, join func(...string) string) string {
	if dstIsDir {
		return join(dst, base)
	}
	return dst
}

// uploadTree copies the local directory src to dst in the Workspace. The
// guest's tar extracts it into a hidden directory (staging) which is then
// moved into place, merged into the destination when that exists, so that
// a failed or cut upload changes nothing there, and a finished one
// replaces each file whole.
func (cp *copier) uploadTree(src, dst string) error {
	ctx := cp.cmd.Context()
	entries, total, err := cp.scanLocalTree(src)
	if err != nil {
		return err
	}
	info, err := cp.statTarget(dst)
	isDir := err == nil && info.GetType() == datav1.FileType_FILE_TYPE_DIRECTORY
	base := filepath.Base(filepath.Clean(src))
	if base == ".." { // the copy of .. is named as the directory it is
		abs, err := filepath.Abs(src)
		if err != nil {
			return err
		}
		base = filepath.Base(abs)
	}
	target := treeTarget(dst, isDir, base, path.Join)
	info, err = cp.statTarget(target)
	exists := err == nil
	if exists && info.GetType() != datav1.FileType_FILE_TYPE_DIRECTORY {
		return fmt.Errorf("%s:%s exists and is not a directory", cp.ws.ID(), target)
	}
	if link, err := cp.ws.Stat(ctx, target, cp.user); !exists && err == nil {
		return fmt.Errorf("%s:%s is a symlink to %s, which is not there", cp.ws.ID(), target, link.GetSymlinkTarget())
	}
	staging, setgid, err := cp.stagingDir(target, exists, info, entries[0].info.Mode())
	if exists { // target's own bit, also when the copy goes there unstaged
		setgid = info.GetMode()&setgidBit != 0
	}
	if setgid {
		// Every directory made in a setgid one has the bit (mkdir gives
		// it), which tar, applying the copy's modes (to the top too: the
		// directory it extracts into), would take away: the copy's
		// directories keep it, so that what is made in them takes the
		// group.
		for i, e := range entries {
			if e.info.IsDir() {
				entries[i].info = withSetgid{e.info}
			}
		}
	}
	writeEntries := func(w io.Writer) error { return writeTree(w, src, entries) }
	switch {
	case exists && connect.CodeOf(err) == connect.CodePermissionDenied:
		// Entries of target the user may write, in a directory it may not.
		cp.out.println(fmt.Sprintf("kibotos: cannot stage the copy in %s:%s (%v): extracting into it directly, so a copy cut short leaves what had arrived", cp.ws.ID(), target, err))
		if err := cp.extractInto(target, total, writeEntries); err != nil {
			return err
		}
	case err != nil:
		return err
	default:
		if err := cp.extractInto(staging, total, writeEntries); err != nil {
			if strings.Contains(err.Error(), "No space left on device") {
				err = fmt.Errorf("%w (the copy is staged whole before it replaces what %s holds, so it needs room for all of it)", err, target)
			}
			return cp.unstage(staging, err)
		}
		if err := cp.ws.Move(ctx, staging, target, cp.user, sdk.MergeDirectories()); err != nil {
			return cp.unstage(staging, err)
		}
	}
	if err := cp.extractInto(target, -1, func(w io.Writer) error { return writeDirTimes(w, entries) }); err != nil {
		return err
	}
	if asRoot(cp.userName) {
		return nil
	}
	return cp.closeDirs(target, entries)
}

// asRoot reports whether the guest's user named name is root by its
// name, as the data plane's own default (empty) is.
func asRoot(name string) bool {
	return name == "" || name == "root" || name == "0"
}

// closeDirs gives the directories of an upload in target their modes, for
// a user other than root: busybox's tar applies modes only as root, and
// otherwise makes a directory with the mode of its header (less the
// umask) and leaves one that exists as it is, so the directories stay as
// open as writeTree sent them. A shell script of chmod commands does it,
// the deepest directories first, so that one closed to its owner is
// closed after what lies beneath it; as tar's, a chmod that fails (of a
// directory of the destination that the user does not own) is passed by.
func (cp *copier) closeDirs(target string, entries []localEntry) error {
	var script bytes.Buffer
	line, mode := 0, fs.FileMode(0)
	for _, e := range slices.Backward(entries) {
		if !e.info.IsDir() {
			continue
		}
		m := e.info.Mode() & (fs.ModePerm | fs.ModeSetgid | fs.ModeSticky)
		if line == 0 || m != mode || line > 32<<10 { // a run of one mode, in arguments of a sane length
			if line > 0 {
				script.WriteString(" 2>/dev/null\n")
			}
			mode = m
			line, _ = fmt.Fprintf(&script, "chmod %o", sdk.UnixMode(m))
		}
		n, _ := script.WriteString(" " + shellQuote("./"+e.rel))
		line += n
	}
	if line > 0 {
		script.WriteString(" 2>/dev/null\n")
	}
	script.WriteString("exit 0\n")
	var stderr bytes.Buffer
	st, err := cp.ws.Exec(cp.cmd.Context(), []string{"sh"}, sdk.ExecOptions{User: cp.userName, Cwd: target, Stdin: &script, Stderr: &stderr, EndWithCaller: true})
	if err == nil && !st.Success() {
		err = fmt.Errorf("chmod in the workspace: %s: %s", st, strings.TrimSpace(stderr.String()))
	}
	return err
}

// shellQuote quotes s as one word for sh, whatever bytes it holds.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// stagingDir makes the hidden directory an upload to target is extracted
// into, on target's filesystem (so that moving it into place renames):
// beside target, or in it when it is a directory already (whose metadata
// is info; it may be a mount point, such as a Volume's). Beside target it
// becomes target, so it takes the mode of the copy's top directory, top,
// open to its owner until the second tar run (writeDirTimes) gives it
// that mode: a tar that is not root must make the copy in it, and a copy
// that fails must be removed from it; in target it is private until its
// entries move out. Either way it keeps
// the setgid bit of the directory it is made in, as mkdir does, so that
// the copy's entries take that directory's group; setgid says so.
func (cp *copier) stagingDir(target string, exists bool, info *datav1.FileInfo, top fs.FileMode) (staging string, setgid bool, err error) {
	ctx := cp.cmd.Context()
	dir, mode := target, fs.FileMode(0o700)
	if !exists {
		dir, mode = path.Dir(target), top.Perm()|0o700
		if err := cp.ws.MkdirAll(ctx, dir, 0o755, cp.user); err != nil {
			return "", false, err
		}
		if info, err = cp.statTarget(dir); err != nil {
			return "", false, err
		}
	}
	if setgid = info.GetMode()&setgidBit != 0; setgid {
		mode |= fs.ModeSetgid
	}
	staging = path.Join(dir, fmt.Sprintf(stagingPrefix+"%016x", rand.Uint64()))
	return staging, setgid, cp.ws.Mkdir(ctx, staging, mode, cp.user)
}

// withSetgid is a directory's metadata with the setgid bit.
type withSetgid struct{ fs.FileInfo }

func (i withSetgid) Mode() fs.FileMode { return i.FileInfo.Mode() | fs.ModeSetgid }

// setgidBit is the setgid bit of a mode as the API carries it.
const setgidBit = 0o2000

// stagingPrefix begins the name of the hidden directory a copy is
// assembled in; the rest is random. The destination's name is left out,
// so that one of the longest names a filesystem takes stays possible.
const stagingPrefix = ".kibotos-cp-"

// unstage removes the staging directory of an upload that failed with
// err, even when the command was interrupted, and returns err, saying
// where the partial copy is when it could not be removed.
func (cp *copier) unstage(staging string, err error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(cp.cmd.Context()), unstageTimeout)
	defer cancel()
	if rerr := cp.ws.RemoveAll(ctx, staging, cp.user); rerr != nil {
		return fmt.Errorf("%w (its partial copy is left in %s:%s: %v)", err, cp.ws.ID(), staging, rerr)
	}
	return err
}

// unstageTimeout bounds removing a failed upload's staging directory.
const unstageTimeout = 10 * time.Second

// extractInto runs the guest's tar to extract into dir the stream write
// writes, of total bytes (-1: unknown, no progress shown).
func (cp *copier) extractInto(dir string, total int64, write func(io.Writer) error) error {
	pr, pw := io.Pipe()
	go func() {
		// Every write to the pipe becomes one SendInput: fill them.
		var out io.Writer = pw
		if total >= 0 {
			out = io.MultiWriter(pw, cp.meter("uploading", total))
		}
		bw := bufio.NewWriterSize(out, stdinChunk)
		err := write(bw)
		pw.CloseWithError(cmp.Or(err, bw.Flush()))
	}()
	extract := []string{"tar", "-x", "-o", "-f", "-", "-C", dir}
	var stderr bytes.Buffer
	st, err := cp.ws.Exec(cp.cmd.Context(), extract, sdk.ExecOptions{User: cp.userName, Stdin: pr, Stderr: &stderr, EndWithCaller: true})
	pr.CloseWithError(errors.New("tar in the workspace ended")) // unblocks write
	return tarStatus(st, err, &stderr)
}

// tarStatus turns how the guest's tar ended into an error. A missing tar
// is an exit status (127), so an error is the call's own.
func tarStatus(st sdk.ExitStatus, err error, stderr *bytes.Buffer) error {
	if err != nil {
		return err
	}
	if !st.Success() {
		msg := strings.TrimSpace(stderr.String())
		if st.Code == 126 || st.Code == 127 {
			msg += " (" + errNeedsTar + ")"
		}
		return fmt.Errorf("tar in the workspace: %s: %s", st, msg)
	}
	return nil
}

// localEntry is one file of a local tree, by its slash-separated path in
// the tree.
type localEntry struct {
	rel  string
	info fs.FileInfo
	link string // a symlink's target
	// hardLink names the earlier entry of the tree that is the same file
	// as this one, which goes as a hard link to it.
	hardLink string
}

// scanLocalTree lists the tree at src and the size of its tar stream,
// refusing symlinks that lead out of it before anything is sent. Sockets,
// devices and FIFOs are skipped with a warning.
func (cp *copier) scanLocalTree(src string) ([]localEntry, int64, error) {
	var (
		entries []localEntry
		total   int64
		files   = map[fileID]string{} // a file of several names → its first entry
	)
	src, err := filepath.EvalSymlinks(src) // a symlink to a directory copies the directory
	if err != nil {
		return nil, 0, err
	}
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := localEntry{rel: rel, info: info}
		switch {
		case info.Mode().IsRegular():
			if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				id := fileID{st.Dev, st.Ino}
				if first, seen := files[id]; seen {
					e.hardLink = first // its bytes go once
					break
				}
				files[id] = rel
			}
			total += (info.Size() + 511) / 512 * 512
		case info.Mode()&fs.ModeSymlink != 0:
			if e.link, err = os.Readlink(p); err != nil {
				return err
			}
			if err := checkLink(rel, filepath.ToSlash(e.link)); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		case !info.IsDir():
			cp.out.println("skipping " + p + ": not a file, directory or symlink")
			return nil
		}
		entries = append(entries, e)
		total += 512 // its header
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	links := map[string]string{}
	for _, e := range entries {
		if e.link != "" {
			links[e.rel] = filepath.ToSlash(e.link)
		}
	}
	if err := checkLinks(links); err != nil {
		return nil, 0, fmt.Errorf("%s: %w", src, err)
	}
	return entries, total + 1024, nil
}

// checkLink refuses a symlink at name (a path in the copy) whose target
// is absolute or leads out of the copy.
func checkLink(name, target string) error {
	if path.IsAbs(target) {
		return fmt.Errorf("symlink %s -> %s is absolute and would point outside the copy: refused", name, target)
	}
	if !filepath.IsLocal(path.Join(path.Dir(name), target)) {
		return fmt.Errorf("symlink %s -> %s leads outside the copy: refused", name, target)
	}
	return nil
}

// checkLinks refuses a tree whose symlinks (name in the copy → target,
// each passed by checkLink) lead out of the copy through one another:
// "up -> a/.." is local as text, but not when a is itself "a -> ..".
func checkLinks(links map[string]string) error {
	for _, name := range slices.Sorted(maps.Keys(links)) {
		if resolvesOutside(links, name) {
			return fmt.Errorf("symlink %s -> %s leads outside the copy through other symlinks of it: refused", name, links[name])
		}
	}
	return nil
}

// resolvesOutside reports whether resolving the symlink name of a tree,
// following the tree's links as the kernel would, climbs above the
// tree's root at some step.
func resolvesOutside(links map[string]string, name string) bool {
	var at []string // the path resolved so far, from the root
	pending := slices.Concat(strings.Split(path.Dir(name), "/"), strings.Split(links[name], "/"))
	for hops := 0; len(pending) > 0; {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(at) == 0 {
				return true
			}
			at = at[:len(at)-1]
			continue
		}
		at = append(at, c)
		target, isLink := links[strings.Join(at, "/")]
		if !isLink {
			continue
		}
		if hops++; hops > maxLinkHops {
			return false // a loop, which resolves to nothing
		}
		at = at[:len(at)-1]
		pending = slices.Concat(strings.Split(target, "/"), pending)
	}
	return false
}

// fileID names a file of the local filesystem, whatever its names.
type fileID struct{ dev, ino uint64 }

// writeTree writes the entries of the tree at src as a tar stream to w.
// Owners are left out: the guest's tar extracts as its user. Directories
// go open to their owner (0700 added to their modes), which writeDirTimes
// then closes: a tar applies a directory's mode as it makes it, before
// its contents, so a tar that is not root could make nothing in a
// read-only one, and the staging directory of a failed copy could not be
// removed.
func writeTree(w io.Writer, src string, entries []localEntry) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		hdr, err := entryHeader(tw, e, true)
		if err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			if err := copyFile(tw, filepath.Join(src, filepath.FromSlash(e.rel))); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// writeDirTimes writes the tree's directories again as a tar stream, the
// deepest first, for a second tar run after the tree's: busybox's tar
// sets a directory's time when it makes it, and the files (and, last of
// all, the symlinks) then made in it move that time again. It also gives
// them their own modes, which writeTree opened; a directory closed before
// its parent stays within reach.
func writeDirTimes(w io.Writer, entries []localEntry) error {
	tw := tar.NewWriter(w)
	for _, e := range slices.Backward(entries) {
		if e.info.IsDir() {
			if _, err := entryHeader(tw, e, false); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

// entryHeader writes the tar header of e; with open, a directory's mode
// lets its owner read, write and enter it.
func entryHeader(tw *tar.Writer, e localEntry, open bool) (*tar.Header, error) {
	hdr, err := tar.FileInfoHeader(e.info, e.link)
	if err != nil {
		return nil, err
	}
	if e.hardLink != "" {
		hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, e.hardLink, 0
	}
	hdr.Name = e.rel
	if e.info.IsDir() {
		hdr.Name += "/"
		if open {
			hdr.Mode |= 0o700
		}
	}
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
	return hdr, tw.WriteHeader(hdr)
}

func copyFile(w io.Writer, name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// downloadTree copies the directory src of the Workspace to the local dst.
func (cp *copier) downloadTree(src, dst string) error {
	dst = filepath.Clean(dst)
	st, err := os.Stat(dst)
	isDir := err == nil && st.IsDir()
	target := treeTarget(dst, isDir, path.Base(path.Clean(src)), filepath.Join)
	if st, err := os.Lstat(target); err == nil && !st.IsDir() {
		return fmt.Errorf("%s exists and is not a directory", target)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(target), stagingPrefix+"*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	ctx, cancel := context.WithCancel(cp.cmd.Context())
	defer cancel()
	pr, pw := io.Pipe()
	var (
		stderr bytes.Buffer
		status sdk.ExitStatus
		done   = make(chan error, 1)
	)
	go func() {
		var err error
		status, err = cp.ws.Exec(ctx, []string{"tar", "-c", "-f", "-", "-C", src, "."}, sdk.ExecOptions{User: cp.userName, Stdout: pw, Stderr: &stderr, EndWithCaller: true})
		pw.CloseWithError(err)
		done <- err
	}()
	dirs, xerr := extractTree(io.TeeReader(pr, cp.meter("downloading", -1)), tmp, cp.out.println)
	if xerr != nil {
		cancel() // kills the guest's tar
		pr.CloseWithError(xerr)
	} else {
		// The end-of-archive blocks are not the end of the stream: a tar
		// pads it to a whole record (GNU tar's: 10 KiB), which it waits to
		// write before it exits.
		io.Copy(io.Discard, pr)
	}
	err = <-done
	if xerr != nil && (err != nil || status.Success()) { // else tar's own error explains a cut stream
		return fmt.Errorf("%s:%s: %w", cp.ws.ID(), src, xerr)
	}
	if err := tarStatus(status, err, &stderr); err != nil {
		return err
	}
	if err := treemove.Move(tmp, target); err != nil {
		return err
	}
	return dirs.apply(target)
}

// extractTree extracts the tar stream r into the directory dir, which it
// does not leave: it opens dir as an os.Root, and refuses entries named
// outside it, symlinks leading out of it, and entries beneath a symlink of
// the stream. Directories are made 0700, so that the tree can be moved out
// of dir or removed by a user who is not root; their modes and times are
// returned, to be applied once the tree is in place. Files are written
// with their blocks of zeros left holes (internal/sparsefile), since the guest's
// tar sends holes as zeros; a sparse entry, which declares more than it
// carries, is refused. Devices and FIFOs are skipped with a warning to
// warn.
func extractTree(r io.Reader, dir string, warn func(string)) (dirAttrs, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	var (
		dirs  dirAttrs
		links = map[string]string{} // name → target
	)
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		name := path.Clean(hdr.Name)
		if name != "." && !filepath.IsLocal(name) {
			return nil, fmt.Errorf("entry %q lands outside the destination: refused", hdr.Name)
		}
		for p := path.Dir(name); p != "."; p = path.Dir(p) {
			if _, ok := links[p]; ok {
				return nil, fmt.Errorf("entry %q is beneath the symlink %s: refused", hdr.Name, p)
			}
		}
		// A directory keeps its setgid and sticky bits; a file its
		// permission bits alone: the copy belongs to whoever runs the CLI,
		// root often, whom a guest's setuid or setgid file must not lend
		// its rights.
		mode := hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetgid | fs.ModeSticky)
		if hdr.Typeflag != tar.TypeDir {
			mode = mode.Perm()
		}
		if hdr.Typeflag != tar.TypeDir && name != "." {
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
				return nil, err
			}
		}
		if sparse(hdr) { // as many zeros as it declares, none of which crossed the wire
			return nil, fmt.Errorf("entry %q is a sparse file, which the workspace's tar does not write: refused", hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return nil, err
			}
			dirs = append(dirs, dirAttr{name, mode, hdr.ModTime})
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return nil, err
			}
			w := sparsefile.NewWriter(f) // the file's holes, sent as zeros, stay holes
			_, err = io.Copy(w, tr)
			if err = errors.Join(err, w.Finish(), f.Close()); err != nil {
				return nil, err
			}
			if err := root.Chmod(name, mode); err != nil {
				return nil, err
			}
		case tar.TypeSymlink:
			if err := checkLink(name, hdr.Linkname); err != nil {
				return nil, err
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return nil, err
			}
			links[name] = hdr.Linkname
		case tar.TypeLink:
			old := path.Clean(hdr.Linkname)
			if !filepath.IsLocal(old) {
				return nil, fmt.Errorf("hard link %s -> %s lands outside the destination: refused", name, hdr.Linkname)
			}
			if target, ok := links[old]; ok {
				// A hard link of a symlink is that symlink again, at another
				// place: it is checked from there.
				if err := checkLink(name, target); err != nil {
					return nil, err
				}
				links[name] = target
			}
			if err := root.Link(old, name); err != nil {
				return nil, err
			}
		default:
			warn("skipping " + printable(hdr.Name, false) + ": not a file, directory or symlink")
		}
		if hdr.Typeflag != tar.TypeDir && !hdr.ModTime.IsZero() {
			lchtimes(root, name, hdr.ModTime) // best effort, as tar does
		}
	}
	if err := checkLinks(links); err != nil {
		return nil, err
	}
	return dirs, nil
}

// lchtimes sets the access and modification times of the entry name of
// root to t, those of a symlink itself (root.Chtimes would set its
// target's).
func lchtimes(root *os.Root, name string, t time.Time) error {
	dir, err := root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer dir.Close()
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.UtimesNanoAt(int(dir.Fd()), path.Base(name), []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// dirAttrs are the modes and modification times of an extracted tree's
// directories, named relative to its top, in the stream's order.
type dirAttrs []dirAttr

type dirAttr struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

// apply gives the directories of the tree at top their modes and times:
// deepest first, so that a read-only directory is closed after what is
// beneath it, and times after their contents changed them.
func (dirs dirAttrs) apply(top string) error {
	root, err := os.OpenRoot(top)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, d := range slices.Backward(dirs) {
		if err := root.Chmod(d.name, d.mode); err != nil {
			return err
		}
		if !d.mtime.IsZero() {
			root.Chtimes(d.name, d.mtime, d.mtime)
		}
	}
	return nil
}

// sparse says whether a tar entry is a sparse file (old GNU or PAX
// GNU.sparse format), which archive/tar reads with its holes as zeros.
func sparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// meter counts the bytes of a copy and shows them on a terminal once
// they pass progressThreshold: as a bar of total, or as a count when the
// total is unknown (-1).
type meter struct {
	out   *statusLine
	verb  string
	total int64
	n     int64
}

func (cp *copier) meter(verb string, total int64) *meter {
	return &meter{out: cp.out, verb: verb, total: total}
}

func (m *meter) Write(p []byte) (int, error) {
	m.n += int64(len(p))
	switch {
	case !m.out.tty || m.n <= progressThreshold:
	case m.total >= 0:
		m.out.update(progressBar(m.verb, uint64(m.n), uint64(m.total)))
	default:
		m.out.update(m.verb + " " + approxSize(uint64(m.n)) + "B")
	}
	return len(p), nil
}
