package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestServerCommandsShareCommonFlags: `up`, `ctrl` and `host` all take the
// listener, logging and config-file flags, and each reads its config file
// before it checks its flags.
func TestServerCommandsShareCommonFlags(t *testing.T) {
	for _, newCmd := range []func() *cobra.Command{upCommand, ctrlCommand, hostCommand} {
		cmd := newCmd()
		for _, name := range []string{"listen", "public-url", "tls-cert", "tls-key", "metrics-token-file",
			"unsafe-exempt-ranges", "log-format", "log-level", "config"} {
			if cmd.Flags().Lookup(name) == nil {
				t.Errorf("%s has no --%s", cmd.Name(), name)
			}
		}

		// A log level from the file reaches the flag and is refused
		// before anything is set up.
		dir := t.TempDir()
		file := filepath.Join(dir, "kibotos.yaml")
		if err := os.WriteFile(file, []byte("log-level: loud\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		home := filepath.Join(dir, "home")
		cmd.SetArgs([]string{"--config", file, "--home", home})
		cmd.SetOut(new(strings.Builder))
		cmd.SetErr(new(strings.Builder))
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `log level "loud"`) {
			t.Errorf("%s --config with log-level: loud: %v", cmd.Name(), err)
		}
		if _, err := os.Stat(home); !os.IsNotExist(err) {
			t.Errorf("%s with a bad config created its home: %v", cmd.Name(), err)
		}
	}
}
