// Package auth authenticates API callers. A caller presents a bearer token
// "<token id>.<secret>"; the store keeps only a SHA-256 of the secret (the
// secret is 256 random bits, so a plain hash is as strong as a slow one).
// Every token belongs to one project and has one role.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// Role is what a token may do within its project.
type Role string

// Roles, from least to most.
const (
	// Viewer reads resources.
	Viewer Role = "viewer"
	// Editor reads and writes resources.
	Editor Role = "editor"
	// Admin also manages the project's tokens; an admin of the operator
	// project manages every project.
	Admin Role = "admin"
)

// Allows reports whether r includes everything need may do.
func (r Role) Allows(need Role) bool { return rank(r) >= rank(need) }

func rank(r Role) int {
	switch r {
	case Viewer:
		return 1
	case Editor:
		return 2
	case Admin:
		return 3
	}
	return 0
}

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return rank(r) > 0 }

// Caller is an authenticated caller.
type Caller struct {
	ProjectID string
	TokenID   string
	Role      Role
	// Operator is set for tokens of the deployment's operator project.
	Operator bool
}

// ErrUnauthenticated is returned for a missing, malformed, unknown or
// revoked token; the reasons are not told apart to the caller.
var ErrUnauthenticated = errors.New("missing or invalid API token")

// NewToken mints a token for a project and returns its record (to store)
// and the bearer secret (to hand out once).
func NewToken(projectID string, role Role, name string, now time.Time) (store.Token, string) {
	s := newSecret()
	tok := store.Token{
		ID: ids.New("tok"), ProjectID: projectID, Role: string(role), Name: name,
		SecretHash: hash(s), CreatedAt: now,
	}
	return tok, tok.ID + "." + s
}

// newSecret returns 256 random bits, base64url.
func newSecret() string {
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return base64.RawURLEncoding.EncodeToString(secret[:])
}

func hash(secret string) []byte {
	sum := sha256.Sum256([]byte(secret))
	return sum[:]
}

// Authenticate resolves a bearer token to its caller.
func Authenticate(ctx context.Context, s store.Store, bearer string) (Caller, error) {
	id, secret, ok := strings.Cut(bearer, ".")
	if !ok || id == "" || secret == "" {
		return Caller{}, ErrUnauthenticated
	}
	var c Caller
	err := s.View(ctx, func(tx store.Tx) error {
		tok, err := tx.Token(ctx, id)
		if err != nil {
			return err
		}
		if subtle.ConstantTimeCompare(tok.SecretHash, hash(secret)) != 1 || !tok.RevokedAt.IsZero() {
			return ErrUnauthenticated
		}
		p, err := tx.Project(ctx, tok.ProjectID)
		if err != nil {
			return err
		}
		c = Caller{ProjectID: p.ID, TokenID: tok.ID, Role: Role(tok.Role), Operator: p.Operator}
		return nil
	})
	switch {
	case errors.Is(err, store.ErrNotFound), errors.Is(err, ErrUnauthenticated):
		return Caller{}, ErrUnauthenticated
	case err != nil:
		return Caller{}, fmt.Errorf("authenticate: %w", err)
	}
	return c, nil
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller ctx carries.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// OperatorProjectName is the name of the project Bootstrap creates.
const OperatorProjectName = "default"

// Bootstrap creates the operator project and its first admin token when
// the deployment has no operator project yet. It returns the token's
// secret, or "" when the deployment was already bootstrapped. keep, when
// not nil, is handed the secret before the two are committed, and an
// error from it commits nothing: a token whose keeping failed (or did not
// end) is never the deployment's only way in, and the next start makes
// another.
func Bootstrap(ctx context.Context, s store.Store, now time.Time, keep func(secret string) error) (string, error) {
	var secret string
	err := s.Update(ctx, func(tx store.Tx) error {
		secret = ""
		projects, err := tx.Projects(ctx)
		if err != nil {
			return err
		}
		for _, p := range projects {
			if p.Operator {
				return nil
			}
		}
		p := store.Project{ID: ids.New("prj"), Name: OperatorProjectName, Operator: true, CreatedAt: now}
		if err := tx.CreateProject(ctx, p); err != nil {
			return err
		}
		var tok store.Token
		tok, secret = NewToken(p.ID, Admin, "bootstrap admin", now)
		if err := tx.CreateToken(ctx, tok); err != nil {
			return err
		}
		if keep != nil {
			return keep(secret)
		}
		return nil
	})
	return secret, err
}

// NewHostToken mints a host token and returns its record (to store) and
// the bearer secret "<id>.<secret>" (to hand out once).
func NewHostToken(name string, now time.Time) (store.HostToken, string) {
	s := newSecret()
	tok := store.HostToken{ID: ids.New("htk"), Name: name, SecretHash: hash(s), CreatedAt: now}
	return tok, tok.ID + "." + s
}

// AuthenticateHost checks a host agent's bearer token against the stored
// host tokens: ErrUnauthenticated when it is malformed, unknown or
// revoked.
func AuthenticateHost(ctx context.Context, s store.Store, bearer string) (tokenID string, err error) {
	id, secret, ok := strings.Cut(bearer, ".")
	if !ok || id == "" || secret == "" {
		return "", ErrUnauthenticated
	}
	err = s.View(ctx, func(tx store.Tx) error {
		tok, err := tx.HostToken(ctx, id)
		if err != nil {
			return err
		}
		if subtle.ConstantTimeCompare(tok.SecretHash, hash(secret)) != 1 || !tok.RevokedAt.IsZero() {
			return ErrUnauthenticated
		}
		return nil
	})
	switch {
	case errors.Is(err, store.ErrNotFound), errors.Is(err, ErrUnauthenticated):
		return "", ErrUnauthenticated
	case err != nil:
		return "", fmt.Errorf("authenticate host: %w", err)
	}
	return id, nil
}

// DeploymentHostToken is the host token ID of the deployment's own host
// secret (server.Config.HostToken), the one `kibotos up`'s host agent
// uses.
const DeploymentHostToken = "deployment"

type hostTokenKey struct{}

// WithHostToken returns ctx carrying the ID of the host token a host API
// call authenticated with.
func WithHostToken(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, hostTokenKey{}, id)
}

// HostTokenFrom returns the host token ID ctx carries; empty without one.
func HostTokenFrom(ctx context.Context) string {
	id, _ := ctx.Value(hostTokenKey{}).(string)
	return id
}
