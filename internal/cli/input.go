package cli

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// parsePairs parses key=value pairs into a map. what names where the pairs
// came from ("--label", "argument") in errors. A value may be empty and may
// contain '='; a key may not be empty or repeated.
func parsePairs(what string, pairs []string) (map[string]string, error) {
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		switch {
		case !ok:
			return nil, fmt.Errorf("%s %q: want key=value", what, p)
		case k == "":
			return nil, fmt.Errorf("%s %q: empty key", what, p)
		}
		if _, dup := m[k]; dup {
			return nil, fmt.Errorf("%s %q: key %q given twice", what, p, k)
		}
		m[k] = v
	}
	return m, nil
}

// metaFlags are the --label and --annotation flags of a create.
type metaFlags struct {
	labels, annotations []string
}

func (f *metaFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringArrayVar(&f.labels, "label", nil, "label key=value (repeatable)")
	cmd.Flags().StringArrayVar(&f.annotations, "annotation", nil, "annotation key=value (repeatable)")
}

func (f *metaFlags) parse() (labels, annotations map[string]string, err error) {
	if labels, err = parsePairs("--label", f.labels); err != nil {
		return nil, nil, err
	}
	if annotations, err = parsePairs("--annotation", f.annotations); err != nil {
		return nil, nil, err
	}
	return labels, annotations, nil
}

// commandFlag registers --command-id on a write.
func commandFlag(cmd *cobra.Command) *string {
	id := new(string)
	cmd.Flags().StringVar(id, "command-id", "",
		"idempotency key: running the command again with the same ID and input returns the first result (default: random)")
	return id
}

// command returns the CommandMetadata of a write: the given ID, else a random
// one. With -o json it reports the ID on stderr, where it does not disturb the
// response on stdout.
func (c *conn) command(cmd *cobra.Command, id string) *ctrlv1.CommandMetadata {
	if id == "" {
		id = uuid.NewString()
	}
	if c.structured() {
		fmt.Fprintf(cmd.ErrOrStderr(), "command_id: %s\n", id)
	}
	return &ctrlv1.CommandMetadata{CommandId: id}
}

// readSecret reads a secret from a file or, when fromStdin, from stdin, and
// strips one trailing newline. Secrets are never flag values: those land in
// shell history and in ps.
func readSecret(cmd *cobra.Command, file string, fromStdin bool) (string, error) {
	var (
		data []byte
		err  error
	)
	switch {
	case fromStdin:
		data, err = io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return "", fmt.Errorf("reading the password from stdin: %w", err)
		}
	case file != "":
		data, err = os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--password-file: %w", err)
		}
	default:
		return "", nil
	}
	s := string(data)
	if t, ok := strings.CutSuffix(s, "\n"); ok {
		s = strings.TrimSuffix(t, "\r")
	}
	return s, nil
}

// readPEM reads the file a --ca-cert flag names; empty means none.
func readPEM(file string) (string, error) {
	if file == "" {
		return "", nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--ca-cert: %w", err)
	}
	return string(data), nil
}

// parseEnum parses a flag value such as "public-internet" as the enum value
// PREFIX_PUBLIC_INTERNET of a generated enum, in any case; the UNSPECIFIED
// zero value is refused. want lists the accepted values for the error.
func parseEnum[E ~int32](flag, s, prefix string, values map[string]int32, want string) (E, error) {
	v, ok := values[prefix+strings.ToUpper(strings.ReplaceAll(s, "-", "_"))]
	if !ok || v == 0 {
		return 0, fmt.Errorf("--%s %q: want %s", flag, s, want)
	}
	return E(v), nil
}

// enumName is the name of an enum value without its prefix:
// enumName(ctrlv1.WorkspaceState_WORKSPACE_STATE_AVAILABLE, "WORKSPACE_STATE_")
// is "AVAILABLE".
func enumName(e fmt.Stringer, prefix string) string {
	return strings.TrimPrefix(e.String(), prefix)
}

// openFile opens a local file and returns it with what Stat says of it.
// The open of a named pipe waits for a writer: one that ctx ends first
// (Ctrl-C) is given up.
func openFile(ctx context.Context, path string) (*os.File, fs.FileInfo, error) {
	var f *os.File
	var err error
	if st, serr := os.Stat(path); serr == nil && st.Mode()&fs.ModeNamedPipe != 0 {
		f, err = openPipe(ctx, path)
	} else {
		f, err = os.Open(path)
	}
	if err != nil {
		return nil, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// openPipe opens a named pipe for reading, which waits for a writer,
// unless ctx ends first.
func openPipe(ctx context.Context, path string) (*os.File, error) {
	type opened struct {
		f   *os.File
		err error
	}
	done := make(chan opened, 1)
	go func() {
		f, err := os.Open(path)
		done <- opened{f, err}
	}()
	select {
	case o := <-done:
		return o.f, o.err
	case <-ctx.Done():
		go func() { // a writer may still come: close what it opens
			if o := <-done; o.f != nil {
				o.f.Close()
			}
		}()
		return nil, fmt.Errorf("%s: waiting for a writer of the named pipe: %w", path, ctx.Err())
	}
}
