package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/kibotos/kibotos/internal/cafile"
)

// A context names one deployment the CLI talks to: its address, an API
// token and the certificate authorities to trust. Contexts live in
// contexts.yaml under the user's configuration directory
// ($XDG_CONFIG_HOME/kibotos or ~/.config/kibotos), readable only by the
// user because it holds tokens. One of them may be current.
//
// A connection setting comes from, in order: its flag (--addr, --token,
// --ca-file); the context named by --context or KIBOTOS_CONTEXT; the
// environment (KIBOTOS_ADDR, KIBOTOS_TOKEN, KIBOTOS_CA_FILE); the current
// context; the default (and HOME/admin-token for the token).

// envContext names the context to use, as --context does.
const envContext = "KIBOTOS_CONTEXT"

// contextsFile is the file under the configuration directory.
const contextsFile = "kibotos/contexts.yaml"

// contextConfig is the content of contexts.yaml.
type contextConfig struct {
	Current  string        `yaml:"current-context,omitempty"`
	Contexts []namedServer `yaml:"contexts"`
}

// namedServer is one context.
type namedServer struct {
	Name   string `yaml:"name"`
	Addr   string `yaml:"addr"`
	Token  string `yaml:"token"`
	CAFile string `yaml:"ca-file,omitempty"`
}

func contextsPath() (string, error) {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("finding the configuration directory: %w", err)
	}
	return filepath.Join(dir, contextsFile), nil
}

// loadContexts reads contexts.yaml; a missing file holds no context.
func loadContexts() (*contextConfig, string, error) {
	path, err := contextsPath()
	if err != nil {
		return nil, "", err
	}
	cfg := new(contextConfig)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, path, nil
	}
	if err == nil {
		err = yaml.Unmarshal(b, cfg)
	}
	if err != nil {
		return nil, "", fmt.Errorf("reading the contexts: %w", err)
	}
	return cfg, path, nil
}

// save replaces the file at path whole, 0600 in a 0700 directory.
func (cfg *contextConfig) save(path string) error {
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return writeAtomically(path, func() fs.FileMode { return 0o600 }, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
}

func (cfg *contextConfig) find(name string) *namedServer {
	i := slices.IndexFunc(cfg.Contexts, func(s namedServer) bool { return s.Name == name })
	if i < 0 {
		return nil
	}
	return &cfg.Contexts[i]
}

// editContexts applies edit to the contexts and saves them, provided the
// context name exists.
func editContexts(name string, edit func(cfg *contextConfig)) error {
	cfg, path, err := loadContexts()
	if err != nil {
		return err
	}
	if cfg.find(name) == nil {
		return fmt.Errorf("no context %q in %s (kibotos context list)", name, path)
	}
	edit(cfg)
	return cfg.save(path)
}

// chosenContext is the context a command uses, if any.
type chosenContext struct {
	*namedServer
	// explicit is true when --context or KIBOTOS_CONTEXT named it; its
	// settings then win over the environment's.
	explicit bool
}

// chooseContext returns the context named by --context or KIBOTOS_CONTEXT,
// else the current one, else none. A context that is named but missing is
// an error.
func (c *conn) chooseContext(cmd *cobra.Command) (chosenContext, error) {
	name := flagOrEnv(cmd, "context", c.context, envContext)
	cfg, path, err := loadContexts()
	if err != nil {
		if name == "" {
			return chosenContext{}, nil // a broken file bothers only those who use it
		}
		return chosenContext{}, err
	}
	if name == "" {
		return chosenContext{namedServer: cfg.find(cfg.Current)}, nil
	}
	s := cfg.find(name)
	if s == nil {
		return chosenContext{}, fmt.Errorf("no context %q in %s (kibotos context list)", name, path)
	}
	return chosenContext{namedServer: s, explicit: true}, nil
}

// setting returns the flag's value when the user gave it, else the
// context's when it was named explicitly, else the environment variable's,
// else the context's, else the flag's default.
func (n chosenContext) setting(cmd *cobra.Command, flag, value, env, fromContext string) string {
	switch {
	case cmd.Flags().Changed(flag):
		return value
	case n.explicit && fromContext != "":
		return fromContext
	case os.Getenv(env) != "":
		return os.Getenv(env)
	case fromContext != "":
		return fromContext
	}
	return value
}

func (n chosenContext) addr() string {
	if n.namedServer == nil {
		return ""
	}
	return n.Addr
}

func (n chosenContext) token() string {
	if n.namedServer == nil {
		return ""
	}
	return n.Token
}

func (n chosenContext) caFile() string {
	if n.namedServer == nil {
		return ""
	}
	return n.CAFile
}

func contextCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "context",
		Short: "Name deployments and switch between them (kept in ~/.config/kibotos/contexts.yaml)",
		Long: "A context names a deployment: its address, an API token and, for a private CA, the\n" +
			"certificate authorities to trust. `kibotos context use NAME` makes one current;\n" +
			"--context NAME (env " + envContext + ") picks one for a command. --addr, --token and\n" +
			"--ca-file still win over the context; KIBOTOS_ADDR, KIBOTOS_TOKEN and KIBOTOS_CA_FILE\n" +
			"win over the current context, not over one named by --context.",
	}
	cmd.AddCommand(contextAddCommand(), contextUseCommand(), contextListCommand(), contextRemoveCommand())
	return cmd
}

func contextAddCommand() *cobra.Command {
	var addr, tokenFile, caFile string
	cmd := &cobra.Command{
		Use:   "add NAME --addr URL --token-file FILE [--ca-file FILE]",
		Short: "Name a deployment; the first context added becomes current",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if name == "" || strings.ContainsAny(name, " \t\n") {
				return fmt.Errorf("context name %q: want a word without spaces", name)
			}
			base, err := baseURL(addr)
			if err != nil {
				return err
			}
			token, err := readTokenFile(tokenFile)
			if err != nil {
				return err
			}
			if caFile != "" {
				if _, err := cafile.Load(caFile); err != nil {
					return fmt.Errorf("--ca-file: %w", err)
				}
				if caFile, err = filepath.Abs(caFile); err != nil {
					return err
				}
			}
			cfg, path, err := loadContexts()
			if err != nil {
				return err
			}
			if cfg.find(name) != nil {
				return fmt.Errorf("context %q exists: remove it first (kibotos context remove %s)", name, name)
			}
			cfg.Contexts = append(cfg.Contexts, namedServer{Name: name, Addr: base, Token: token, CAFile: caFile})
			if cfg.Current == "" {
				cfg.Current = name
			}
			return cfg.save(path)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "control plane address, URL or host:port")
	cmd.Flags().StringVar(&tokenFile, "token-file", "", "file whose first line is the API token; the token is copied into the context")
	cmd.Flags().StringVar(&caFile, "ca-file", "", "PEM certificate authorities trusted for https:// beside the system's")
	cmd.MarkFlagRequired("addr")
	cmd.MarkFlagRequired("token-file")
	return cmd
}

// readTokenFile returns the first line of the file at path.
func readTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	if t := strings.TrimSpace(first); t != "" {
		return t, nil
	}
	return "", fmt.Errorf("--token-file %s: the first line is empty", path)
}

func contextUseCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "use NAME",
		Short:             "Make a context current",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			return editContexts(args[0], func(cfg *contextConfig) { cfg.Current = args[0] })
		},
	}
}

func contextListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the contexts; * marks the current one",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := loadContexts()
			if err != nil {
				return err
			}
			t := table[namedServer]{
				header: []string{"CURRENT", "NAME", "ADDR", "CA-FILE"},
				row: func(s namedServer) []string {
					current := ""
					if s.Name == cfg.Current {
						current = "*"
					}
					return []string{current, s.Name, s.Addr, orDash(s.CAFile)}
				},
			}
			return t.write(cmd.OutOrStdout(), cfg.Contexts, false)
		},
	}
}

func contextRemoveCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "remove NAME",
		Short:             "Forget a context (and its token)",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeContexts,
		RunE: func(cmd *cobra.Command, args []string) error {
			var wasCurrent bool
			var others []string
			err := editContexts(args[0], func(cfg *contextConfig) {
				cfg.Contexts = slices.DeleteFunc(cfg.Contexts, func(s namedServer) bool { return s.Name == args[0] })
				if wasCurrent = cfg.Current == args[0]; wasCurrent {
					cfg.Current = ""
				}
				for _, s := range cfg.Contexts {
					others = append(others, s.Name)
				}
			})
			if err != nil || !wasCurrent {
				return err
			}
			hint := "commands now use KIBOTOS_ADDR and KIBOTOS_TOKEN, or the local server"
			if len(others) > 0 {
				hint += "; pick another with: kibotos context use " + strings.Join(others, "|")
			}
			_, err = fmt.Fprintf(cmd.ErrOrStderr(), "%s was the current context: no context is current now; %s\n", args[0], hint)
			return err
		},
	}
}

// completeContexts completes the names of the contexts.
func completeContexts(_ *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	cfg, _, err := loadContexts()
	if err != nil || len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []string
	for _, s := range cfg.Contexts {
		if strings.HasPrefix(s.Name, prefix) {
			names = append(names, s.Name)
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}
