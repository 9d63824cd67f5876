// Command kibotos is the Kibotos CLI. The server verbs, `kibotos up`,
// `ctrl` and `host`, are kibotos-server's: kibotos execs it in its own
// place (same pid, arguments and environment), from the directory of this
// executable or else from PATH. The CLI links none of the server's
// packages (SQLite, gVisor's netstack, the S3 and registry clients,
// Prometheus), whose package initialisation would otherwise cost every
// `kibotos ws exec` tens of milliseconds of CPU.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kibotos/kibotos/internal/cli"
)

// serverBinary is the binary of the server verbs.
const serverBinary = "kibotos-server"

func main() {
	verbs := make([]*cobra.Command, 0, len(cli.ServerVerbs))
	for _, v := range cli.ServerVerbs {
		verbs = append(verbs, &cobra.Command{
			Use:                v.Name,
			Short:              v.Short + " (" + serverBinary + ")",
			DisableFlagParsing: true, // kibotos-server parses them, --help too
			RunE: func(*cobra.Command, []string) error {
				return execServer(os.Args[1:])
			},
		})
	}
	cli.Main(cli.Root(verbs...))
}

// execServer replaces this process with kibotos-server and args. It
// returns only on failure.
func execServer(args []string) error {
	path, err := serverPath()
	if err != nil {
		return err
	}
	return syscall.Exec(path, append([]string{path}, args...), os.Environ())
}

// serverPath finds kibotos-server: beside this executable (make install
// puts both in one directory), else on PATH.
func serverPath() (string, error) {
	if self, err := os.Executable(); err == nil {
		if self, err = filepath.EvalSymlinks(self); err == nil {
			path := filepath.Join(filepath.Dir(self), serverBinary)
			if _, err := os.Stat(path); err == nil {
				return path, nil
			}
		}
	}
	path, err := exec.LookPath(serverBinary)
	if errors.Is(err, exec.ErrNotFound) {
		return "", fmt.Errorf("%s is in neither this executable's directory nor PATH: the server verbs are its (make build puts it in bin/, make install beside kibotos)", serverBinary)
	}
	return path, err
}
