package projects

// This file is the host tokens: what `kibotos host` authenticates with,
// issued and revoked by an admin of the operator project.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// MaxHostTokenHosts bounds the host IDs one host token names.
const MaxHostTokenHosts = 256

// CreateHostToken issues a host token that may register the hosts of
// hostIDs, or any host with anyHost, and returns it with its secret.
// Naming both, or neither, is invalid_argument: which hosts a token
// serves is always the issuer's choice.
func (s *Service) CreateHostToken(ctx context.Context, name string, hostIDs []string, anyHost bool) (store.HostToken, string, error) {
	if err := Operator(ctx, "issue host tokens"); err != nil {
		return store.HostToken{}, "", err
	}
	if len(name) > MaxTokenName || !utf8.ValidString(name) {
		return store.HostToken{}, "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("name must be valid UTF-8 of at most %d bytes", MaxTokenName))
	}
	hostIDs, err := checkTokenHosts(hostIDs, anyHost)
	if err != nil {
		return store.HostToken{}, "", err
	}
	tok, secret := auth.NewHostToken(name, time.Now().UTC())
	tok.HostIDs, tok.AnyHost = hostIDs, anyHost
	err = s.Store.Update(ctx, func(tx store.Tx) error { return tx.CreateHostToken(ctx, tok) })
	return tok, secret, err
}

// checkTokenHosts validates the hosts a new host token may register and
// returns its host IDs sorted, each once.
func checkTokenHosts(hostIDs []string, anyHost bool) ([]string, error) {
	switch {
	case anyHost && len(hostIDs) > 0:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a host token names the hosts it may register (host_ids) or may register any host (any_host), not both"))
	case anyHost:
		return nil, nil
	case len(hostIDs) == 0:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New(
			"name the host IDs the token may register (host_ids; kibotos admin host-token create --host), or set any_host (--any-host) for a token that may register any host"))
	case len(hostIDs) > MaxHostTokenHosts:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("a host token names at most %d host IDs", MaxHostTokenHosts))
	}
	for i, id := range hostIDs {
		if !dnsLabel.MatchString(id) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
				"host_ids[%d] is not a host ID: 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit", i))
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(hostIDs))), nil
}

// ListHostTokens returns every host token.
func (s *Service) ListHostTokens(ctx context.Context) ([]store.HostToken, error) {
	if err := Operator(ctx, "list host tokens"); err != nil {
		return nil, err
	}
	var out []store.HostToken
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		out, err = tx.HostTokens(ctx)
		return err
	})
	return out, err
}

// RevokeHostToken revokes a host token; revoking a revoked one returns it
// unchanged.
func (s *Service) RevokeHostToken(ctx context.Context, id string) (store.HostToken, error) {
	if err := Operator(ctx, "revoke host tokens"); err != nil {
		return store.HostToken{}, err
	}
	var tok store.HostToken
	err := s.Store.Update(ctx, func(tx store.Tx) error {
		var err error
		if tok, err = tx.HostToken(ctx, id); errors.Is(err, store.ErrNotFound) {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("host token %q not found", id))
		} else if err != nil || !tok.RevokedAt.IsZero() {
			return err
		}
		tok.RevokedAt = time.Now().UTC()
		return tx.RevokeHostToken(ctx, id, tok.RevokedAt)
	})
	return tok, err
}
