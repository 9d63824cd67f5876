package cli

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/cobra"

	ctrlv1 "github.com/kibotos/kibotos/gen/kibotos/ctrl/v1"
)

// registryFlags are the credentials of a registry pull.
type registryFlags struct {
	username      string
	passwordStdin bool
}

func (f *registryFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.username, "username", "", "registry username (default: the credentials `docker login` stored for the registry)")
	cmd.Flags().BoolVar(&f.passwordStdin, "password-stdin", false, "read the registry password or token from stdin (one trailing newline is stripped)")
	cmd.MarkFlagsRequiredTogether("username", "password-stdin")
}

func (f *registryFlags) set() bool { return f.username != "" || f.passwordStdin }

// credentials returns the credentials to pull ref with: the flags', else
// those the docker config (and its credential helpers) holds for ref's
// registry, else nil (anonymous).
func (f *registryFlags) credentials(cmd *cobra.Command, ref string) (*ctrlv1.RegistryCredentials, error) {
	if f.passwordStdin && f.username == "" {
		return nil, errors.New("--password-stdin needs --username")
	}
	if f.username != "" {
		password, err := readSecret(cmd, "", f.passwordStdin)
		if err != nil {
			return nil, err
		}
		return &ctrlv1.RegistryCredentials{Username: f.username, Password: password}, nil
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	a, err := authn.DefaultKeychain.Resolve(r.Context().Registry)
	if err != nil {
		return nil, fmt.Errorf("reading the docker credentials of %s: %w", r.Context().RegistryStr(), err)
	}
	return fromAuthConfig(a)
}

// fromAuthConfig returns what an authenticator of the docker keychain
// holds, nil for anonymous.
func fromAuthConfig(a authn.Authenticator) (*ctrlv1.RegistryCredentials, error) {
	cfg, err := a.Authorization()
	if err != nil {
		return nil, fmt.Errorf("docker credentials: %w", err)
	}
	user, password := cfg.Username, cfg.Password
	if user == "" && password == "" && cfg.Auth != "" {
		b, err := base64.StdEncoding.DecodeString(cfg.Auth)
		if err != nil {
			return nil, fmt.Errorf("docker credentials: auth is not base64: %w", err)
		}
		var ok bool
		if user, password, ok = strings.Cut(string(b), ":"); !ok {
			return nil, errors.New("docker credentials: auth is not user:password")
		}
	}
	out := &ctrlv1.RegistryCredentials{Username: user, Password: password, IdentityToken: cfg.IdentityToken}
	if out.Username == "" && out.Password == "" && out.IdentityToken == "" {
		return nil, nil
	}
	return out, nil
}
