package cli

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
	"github.com/kibotos/kibotos/gen/kibotos/ctrl/v1/ctrlv1connect"
	"github.com/kibotos/kibotos/sdk/chunked"
)

// chunkSize is the size of the chunks an archive is uploaded in.
const chunkSize = chunked.Size

// archiveFormats maps --format to the wire enum; the names are skopeo's.
var archiveFormats = map[string]ctrlv1.ImageArchiveFormat{
	"docker-archive": ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL,
	"oci-archive":    ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_OCI_LAYOUT_TAR,
}

func templateImportCommand(c *conn) *cobra.Command {
	var (
		format, registry, platform string
		setDefault                 bool
		creds                      registryFlags
	)
	cmd := &cobra.Command{
		Use:   "import ID (FILE [--format docker-archive|oci-archive] | REF) [--set-default]",
		Short: "Add an OCI image to a Template as a new revision, from an archive or a registry",
		Long: "Add an OCI image to a Template as a new revision: upload FILE, an uncompressed image tar,\n" +
			"or have the server pull REF, such as docker.io/library/debian:12 or registry.example.com/app@sha256:...,\n" +
			"from a registry it reaches.\n\n" +
			"FILE is a docker archive (docker save, crane save, skopeo copy to docker-archive:) or the tar\n" +
			"of an OCI image layout (skopeo copy to oci-archive:). Without --format the command reads the\n" +
			"tar's entries: manifest.json at the root means docker-archive, else oci-layout at the root\n" +
			"(or in its only top-level directory) means oci-archive. The second argument is a FILE when\n" +
			"such a file exists or it ends in .tar or starts with . or /; else it is a REF (--registry REF\n" +
			"says so explicitly).\n\n" +
			"A REF is pulled by the server. An image index resolves to the image of --platform (default:\n" +
			"the platform the deployment's hosts run, linux/amd64). The registry credentials are\n" +
			"--username with --password-stdin, else those of `docker login` (the docker config file and\n" +
			"its credential helpers) for the REF's registry, else none. They are sent to the server for\n" +
			"this pull only and never stored. Refused credentials are permission_denied, a missing\n" +
			"repository, tag or platform not_found, a registry the server may not reach\n" +
			"failed_precondition; none of them stores anything.\n\n" +
			"Importing an image the Template already has returns that revision. The first revision\n" +
			"becomes the default; --set-default makes any later one the default.",
		Args: cobra.RangeArgs(1, 2),
	}
	cmd.Flags().StringVar(&format, "format", "", "format of FILE: docker-archive or oci-archive (default: detected)")
	cmd.Flags().StringVar(&registry, "registry", "", "image reference for the server to pull instead of a FILE")
	cmd.Flags().StringVar(&platform, "platform", "", "os/arch[/variant] of the image to pull from an image index (default: the hosts' platform, linux/amd64)")
	cmd.Flags().BoolVar(&setDefault, "set-default", false, "make the imported revision the Template's default")
	creds.register(cmd)
	commandID := commandFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		start := &ctrlv1.ImportTemplateRevisionStart{TemplateId: args[0], SetDefault: setDefault}
		var (
			file *os.File
			size int64
		)
		if registry == "" && len(args) == 2 && !isFileArg(args[1]) {
			registry = args[1]
			args = args[:1]
		}
		switch {
		case registry != "" && len(args) == 2:
			return errors.New("give the image as FILE or as --registry REF, not both")
		case registry != "" && format != "":
			return errors.New("--format describes a FILE; a registry image has none")
		case registry != "":
			rc, err := creds.credentials(cmd, registry)
			if err != nil {
				return err
			}
			start.Source = &ctrlv1.ImportTemplateRevisionStart_RegistryReference{RegistryReference: registry}
			start.RegistryCredentials, start.Platform = rc, platform
		case creds.set() || platform != "":
			return errors.New("--platform, --username and --password-stdin describe a registry pull, not a FILE")
		case len(args) == 2:
			f, st, err := openFile(cmd.Context(), args[1])
			if err != nil {
				return err
			}
			defer f.Close()
			af, err := archiveFormat(f, format)
			if err != nil {
				return err
			}
			file, size = f, st.Size()
			start.Source = &ctrlv1.ImportTemplateRevisionStart_Archive{Archive: af}
		default:
			return errors.New("give the image as FILE or REF")
		}
		cl, closeIdle, err := dialStreaming(cmd, c, ctrlv1connect.NewTemplateServiceClient)
		if err != nil {
			return err
		}
		defer closeIdle()
		start.Command = c.command(cmd, *commandID)
		u := &upload{out: newStatusLine(cmd.ErrOrStderr()), size: size}
		if file != nil {
			u.body = file
		} else {
			u.out.update(fmt.Sprintf("the server is pulling %s and verifying every layer", registry))
		}
		resp, err := u.run(cmd.Context(), cl, start)
		if err != nil {
			return err
		}
		row := templateRevision{resp.GetRevision(), resp.GetRevision().GetRevision() == resp.GetTemplate().GetDefaultRevision()}
		return show(cmd, c, resp, revisionTable, row)
	}
	return cmd
}

// isFileArg reports whether the image argument of template import names a
// file rather than a registry reference: an existing file, or a path that
// ends in .tar or starts with . or /.
func isFileArg(arg string) bool {
	if _, err := os.Stat(arg); err == nil {
		return true
	}
	return strings.HasSuffix(arg, ".tar") || strings.HasPrefix(arg, ".") || strings.HasPrefix(arg, "/")
}

// archiveFormat returns the format --format names or, when it is empty, the
// one detectFormat reads from f.
func archiveFormat(f *os.File, flag string) (ctrlv1.ImageArchiveFormat, error) {
	if flag != "" {
		af, ok := archiveFormats[flag]
		if !ok {
			return 0, fmt.Errorf("--format %q: want docker-archive or oci-archive", flag)
		}
		return af, nil
	}
	af, err := detectFormat(f)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", f.Name(), err)
	}
	return af, nil
}

// detectFormat tells the two archive formats apart by the tar's entries: a
// docker archive has manifest.json at its root, an OCI layout tar has
// oci-layout at its root or in its only top-level directory. Docker 25 and
// later write both, which the docker reading handles. It reads headers
// only (a tar.Reader seeks over the contents) and rewinds r.
func detectFormat(r io.ReadSeeker) (ctrlv1.ImageArchiveFormat, error) {
	var magic [2]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return 0, fmt.Errorf("not an image archive: %w", err)
	}
	if magic == [2]byte{0x1f, 0x8b} {
		return 0, errors.New("gzip-compressed: the server reads plain tar, decompress it first (gunzip)")
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	var (
		ociRoot, ociNested bool
		tops               = map[string]bool{}
		tr                 = tar.NewReader(r)
	)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("cannot detect the format, not a readable tar (%v): pass --format", err)
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if name == "" {
			continue
		}
		top, rest, _ := strings.Cut(name, "/")
		tops[top] = true
		switch {
		case name == "manifest.json":
			_, err := r.Seek(0, io.SeekStart)
			return ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_TARBALL, err
		case name == "oci-layout":
			ociRoot = true
		case rest == "oci-layout":
			ociNested = true
		}
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	if ociRoot || (ociNested && len(tops) == 1) {
		return ctrlv1.ImageArchiveFormat_IMAGE_ARCHIVE_FORMAT_OCI_LAYOUT_TAR, nil
	}
	return 0, errors.New("cannot detect the format: the tar has neither manifest.json (docker-archive) nor oci-layout (oci-archive) at its root; pass --format")
}

// upload is one ImportTemplateRevision call: start, then body in chunks
// with a progress bar on a terminal.
type upload struct {
	out  *statusLine
	body io.Reader // nil for a registry import
	size int64     // of body, for the progress bar
	sent int64
}

func (u *upload) run(ctx context.Context, cl templateClient, start *ctrlv1.ImportTemplateRevisionStart) (*ctrlv1.ImportTemplateRevisionResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // on a read error, abandons the call
	defer u.out.end()
	stream := cl.ImportTemplateRevision(ctx)
	err := stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Start{Start: start}})
	if err == nil && u.body != nil {
		var rerr error
		_, rerr, err = chunked.Send(u.body, chunkSize, func(chunk []byte) error {
			// Send marshals the message before it returns, so chunk can be reused.
			if err := stream.Send(&ctrlv1.ImportTemplateRevisionRequest{Part: &ctrlv1.ImportTemplateRevisionRequest_Chunk{Chunk: chunk}}); err != nil {
				return err
			}
			u.sent += int64(len(chunk))
			u.progress()
			return nil
		})
		if rerr != nil {
			return nil, fmt.Errorf("reading the archive: %w", rerr)
		}
		if err == nil {
			u.out.update(fmt.Sprintf("uploaded %sB; the server is importing it", approxSize(uint64(u.sent))))
		}
	}
	return chunked.Receive(stream, err)
}

// progress draws the progress bar on a terminal.
func (u *upload) progress() {
	if !u.out.tty || u.size <= 0 {
		return
	}
	u.out.update(progressBar("uploading", uint64(u.sent), uint64(u.size)))
}
