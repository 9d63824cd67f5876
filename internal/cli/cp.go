package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	datav1 "github.com/kibotos/kibotos/gen/kibotos/data/v1"
	"github.com/kibotos/kibotos/internal/sparsefile"
	"github.com/kibotos/kibotos/sdk"
)

// progressThreshold is the size from which cp shows a progress bar.
const progressThreshold = 8 << 20

// cpOperand is one side of `ws cp`: a path in a Workspace, a local path, or
// "-" for stdin or stdout.
type cpOperand struct {
	ws   string // empty for a local operand
	path string
}

func (o cpOperand) stdio() bool { return o.ws == "" && o.path == "-" }

// parseCpOperand reads WS:PATH as remote when WS is not empty and holds no
// '/'; anything else is local, so ./a:b names a local file.
func parseCpOperand(s string) (cpOperand, error) {
	ws, p, ok := strings.Cut(s, ":")
	if !ok || ws == "" || strings.Contains(ws, "/") {
		return cpOperand{path: s}, nil
	}
	if p == "" {
		return cpOperand{}, fmt.Errorf("%q: want WS:PATH with a path in the workspace", s)
	}
	return cpOperand{ws: ws, path: p}, nil
}

func wsCpCommand(c *conn) *cobra.Command {
	var (
		user      string
		recursive bool
	)
	cmd := &cobra.Command{
		Use:   "cp [-r] [--user NAME] SRC DST",
		Short: "Copy a file or directory between here and a Workspace",
		Long: "Copy one file into or out of a Workspace. One of SRC and DST is WS:PATH, a path in\n" +
			"Workspace WS; the other a local path, or - for stdin or stdout. A local path with a\n" +
			"colon before any slash reads as WS:PATH: write it as ./NAME.\n\n" +
			"When DST is a directory, or ends in /, the file keeps its name inside it. The file is\n" +
			"written to a temporary file and renamed into place, so a failed copy leaves DST as it\n" +
			"was. A new file gets the mode of SRC, or of the file it links to when SRC is a symlink;\n" +
			"an existing one keeps its own, and a symlink at DST is written through, as cp does.\n" +
			"Copies of more than 8 MiB show their progress on stderr when it is a terminal.\n\n" +
			"With -r, SRC may be a directory: it is copied whole, as a tar stream through tar in the\n" +
			"workspace, keeping permission bits, times and symlinks (a download drops the setuid and\n" +
			"setgid bits of files), into DST when DST is a directory, else as\n" +
			"DST. An entry or symlink that would land or point outside DST (.., an absolute target)\n" +
			"is refused. Either way the copy is assembled in a hidden directory and moved into place\n" +
			"once whole, merged into DST's directory when that exists, each file replacing its\n" +
			"namesake whole: a failed or interrupted copy leaves DST as it was.",
		Args: cobra.ExactArgs(2),
	}
	cmd.Flags().StringVar(&user, "user", "", "user of the guest that reads or writes the file (default: root)")
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "copy directories too")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		src, err := parseCpOperand(args[0])
		if err != nil {
			return err
		}
		dst, err := parseCpOperand(args[1])
		if err != nil {
			return err
		}
		var remote cpOperand
		switch {
		case src.ws != "" && dst.ws != "":
			return errors.New("both SRC and DST are in a workspace: copy through a local file")
		case src.ws == "" && dst.ws == "":
			return errors.New("neither SRC nor DST is in a workspace: give one as WS:PATH")
		case src.ws != "":
			remote = src
		default:
			remote = dst
		}
		ws, closeIdle, err := openWorkspace(cmd, c, remote.ws)
		if err != nil {
			return err
		}
		defer closeIdle()
		cp := &copier{cmd: cmd, ws: ws, user: sdk.AsUser(user), userName: user, out: newStatusLine(cmd.ErrOrStderr())}
		defer cp.out.end()
		if recursive && !src.stdio() && !dst.stdio() {
			tree, err := cp.isTree(src)
			if err != nil {
				return err
			}
			if tree {
				return cp.copyTree(src, dst)
			}
		}
		if src.ws != "" {
			return cp.download(src.path, dst)
		}
		return cp.upload(src, dst.path)
	}
	return cmd
}

// copier is one `ws cp`.
type copier struct {
	cmd      *cobra.Command
	ws       *sdk.Workspace
	user     sdk.FileOption
	userName string
	out      *statusLine
}

// progress returns the option that draws a bar for a copy of size bytes,
// none when it is small or stderr is not a terminal.
func (cp *copier) progress(verb string, size int64) []sdk.FileOption {
	if !cp.out.tty || size <= progressThreshold {
		return nil
	}
	return []sdk.FileOption{sdk.WithProgress(func(n int64) {
		cp.out.update(progressBar(verb, uint64(n), uint64(size)))
	})}
}

func (cp *copier) upload(src cpOperand, dst string) error {
	ctx := cp.cmd.Context()
	var (
		r    io.Reader = cp.cmd.InOrStdin()
		size int64     = -1
		mode fs.FileMode
	)
	if !src.stdio() {
		f, st, err := openFile(ctx, src.path)
		if err != nil {
			return err
		}
		defer f.Close()
		if st.IsDir() {
			return fmt.Errorf("%s is a directory: cp copies one file; -r copies a directory", src.path)
		}
		r, size, mode = f, st.Size(), st.Mode()
	}
	if cp.remoteDir(dst) {
		if src.stdio() {
			return fmt.Errorf("%s is a directory: name the file to write stdin to", dst)
		}
		dst = path.Join(dst, filepath.Base(src.path))
	}
	_, err := cp.ws.Upload(ctx, r, dst, mode, append(cp.progress("uploading", size), cp.user)...)
	return err
}

// remoteDir reports whether p names a directory of the Workspace, itself
// or through symlinks (cp into a link to a directory copies into the
// directory): it ends in / or InspectFile says so. Any other answer leaves
// the call that writes p to report it.
func (cp *copier) remoteDir(p string) bool {
	if strings.HasSuffix(p, "/") {
		return true
	}
	info, err := cp.statTarget(p)
	return err == nil && info.GetType() == datav1.FileType_FILE_TYPE_DIRECTORY
}

// maxLinkHops is how many symlinks statTarget and resolvesOutside follow
// before they give up, as Linux does (ELOOP).
const maxLinkHops = 40

// statTarget returns the metadata of the file p names in the Workspace,
// following symlinks as the guest's ReadFile does, so that a link to a
// directory is refused as one, progress counts the target's size, and a copy
// gets the mode of the file read, never a link's 0777, also from a guest
// whose ReadFile does not carry the file's metadata.
func (cp *copier) statTarget(p string) (*datav1.FileInfo, error) {
	for range maxLinkHops {
		info, err := cp.ws.Stat(cp.cmd.Context(), p, cp.user)
		if err != nil || info.GetType() != datav1.FileType_FILE_TYPE_SYMLINK {
			return info, err
		}
		target := info.GetSymlinkTarget()
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		p = target
	}
	return nil, fmt.Errorf("%s: too many levels of symbolic links", p)
}

func (cp *copier) download(src string, dst cpOperand) error {
	ctx := cp.cmd.Context()
	info, err := cp.statTarget(src)
	if err != nil {
		return err
	}
	size := int64(-1)
	switch info.GetType() {
	case datav1.FileType_FILE_TYPE_DIRECTORY:
		return fmt.Errorf("%s is a directory: cp copies one file; -r copies a directory", src)
	case datav1.FileType_FILE_TYPE_FILE:
		size = int64(info.GetSize())
	default:
		// A fifo would give what some writer happens to send, a device
		// may never end.
		return fmt.Errorf("%s is not a regular file (a fifo, socket or device): cp copies files and, with -r, directories", src)
	}
	opts := append(cp.progress("downloading", size), cp.user)
	if dst.stdio() {
		_, err := cp.ws.Download(ctx, src, cp.cmd.OutOrStdout(), opts...)
		return err
	}
	target := dst.path
	if st, err := os.Stat(target); (err == nil && st.IsDir()) || strings.HasSuffix(target, string(filepath.Separator)) {
		target = filepath.Join(target, path.Base(src))
	}
	// A link at the target is written through, as cp does, and an
	// existing file keeps its mode; a new one gets the mode of the file
	// read, whose metadata ReadFile sends has the last word.
	if fi, err := os.Lstat(target); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		resolved, err := filepath.EvalSymlinks(target)
		if err != nil {
			return fmt.Errorf("%s is a symbolic link whose target cannot be written: %w", target, err)
		}
		target = resolved
	}
	mode := fs.FileMode(info.GetMode()).Perm()
	existing, err := os.Stat(target)
	if err == nil && existing.Mode().IsRegular() {
		mode = existing.Mode().Perm()
	} else {
		opts = append(opts, sdk.WithFileInfo(func(f *datav1.FileInfo) { mode = fs.FileMode(f.GetMode()).Perm() }))
	}
	return writeAtomically(target, func() fs.FileMode { return cmp.Or(mode, 0o644) }, func(f *os.File) error {
		w := sparsefile.NewWriter(f) // a file with holes there keeps them here
		if _, err := cp.ws.Download(ctx, src, w, opts...); err != nil {
			return err
		}
		return w.Finish()
	})
}

// writeAtomically writes a file with write into a temporary file beside
// target, gives it the mode that mode returns once written and renames it
// into place; on failure target stays as it was. The temporary name is
// short, whatever target's (a name of 255 bytes has no room for more).
func writeAtomically(target string, mode func() fs.FileMode, write func(*os.File) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(target), ".kibotos-*.part")
	if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
		// Named by the file asked for, not by the temporary one.
		return &fs.PathError{Op: "create", Path: target, Err: pe.Err}
	}
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := write(f); err != nil {
		return err
	}
	if err := f.Chmod(mode()); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), target)
}
