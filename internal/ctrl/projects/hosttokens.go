package projects

// This file is the host tokens: what `kibotos host` authenticates with,
// issued and revoked by an admin of the operator project.

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// CreateHostToken issues a host token and returns it with its secret.
func (s *Service) CreateHostToken(ctx context.Context, name string) (store.HostToken, string, error) {
	if err := Operator(ctx, "issue host tokens"); err != nil {
		return store.HostToken{}, "", err
	}
	if len(name) > MaxTokenName || !utf8.ValidString(name) {
		return store.HostToken{}, "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("name must be valid UTF-8 of at most %d bytes", MaxTokenName))
	}
	tok, secret := auth.NewHostToken(name, time.Now().UTC())
	err := s.Store.Update(ctx, func(tx store.Tx) error { return tx.CreateHostToken(ctx, tok) })
	return tok, secret, err
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
