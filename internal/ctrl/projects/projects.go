// Package projects is ctrl's AdminService: projects and their tokens, and
// who may manage them. A token's admin manages its own project; an admin
// of the operator project manages every project (another project is
// not_found to everyone else, so its existence is never revealed) and the
// deployment (creating projects, storage pools).
//
// Every error this package returns is a *connect.Error with its canonical
// code, or an internal error that the server reports as such.
package projects

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	"github.com/kibotos/kibotos/internal/ctrl/auth"
	"github.com/kibotos/kibotos/internal/ctrl/ids"
	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// MaxTokenName bounds a token's name.
const MaxTokenName = 128

// dnsLabel is what project names and host IDs are: short, lower case,
// safe in a URL or a file name.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// Service implements the project and token methods over a store.
type Service struct {
	Store store.Store
	// Tokens, when set, forgets a token as soon as it is revoked here;
	// other replicas' caches let it go within their TTL.
	Tokens *auth.Cache
}

// Admin returns the caller when it holds the admin role.
func Admin(ctx context.Context) (auth.Caller, error) {
	c, _ := auth.CallerFrom(ctx)
	if c.Role != auth.Admin {
		return c, connect.NewError(connect.CodePermissionDenied, errors.New("this call needs an admin token"))
	}
	return c, nil
}

// Operator refuses every caller but an admin of the operator project;
// what names the call in the refusal.
func Operator(ctx context.Context, what string) error {
	c, err := Admin(ctx)
	if err == nil && !c.Operator {
		err = connect.NewError(connect.CodePermissionDenied, fmt.Errorf("only an admin token of the operator project may %s", what))
	}
	return err
}

// manages resolves the project an admin call acts on: empty is the
// caller's; another project needs an operator admin and is otherwise
// not_found.
func manages(ctx context.Context, tx store.Tx, c auth.Caller, projectID string) (string, error) {
	if projectID == "" || projectID == c.ProjectID {
		return c.ProjectID, nil
	}
	notFound := connect.NewError(connect.CodeNotFound, fmt.Errorf("project %q not found", projectID))
	if !c.Operator {
		return "", notFound
	}
	if _, err := tx.Project(ctx, projectID); errors.Is(err, store.ErrNotFound) {
		return "", notFound
	} else if err != nil {
		return "", err
	}
	return projectID, nil
}

// CreateProject creates a project; only an operator admin may.
func (s *Service) CreateProject(ctx context.Context, name string) (store.Project, error) {
	if err := Operator(ctx, "create projects"); err != nil {
		return store.Project{}, err
	}
	if !dnsLabel.MatchString(name) {
		return store.Project{}, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
			"name %q: must be 1 to 63 lower-case letters, digits and hyphens, starting and ending with a letter or digit", name))
	}
	p := store.Project{ID: ids.New("prj"), Name: name, CreatedAt: time.Now().UTC()}
	err := s.Store.Update(ctx, func(tx store.Tx) error { return tx.CreateProject(ctx, p) })
	if errors.Is(err, store.ErrExists) {
		return store.Project{}, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("a project named %q already exists", name))
	}
	return p, err
}

// ListProjects returns every project to an operator admin, and the
// caller's own project to anyone else.
func (s *Service) ListProjects(ctx context.Context) ([]store.Project, error) {
	c, _ := auth.CallerFrom(ctx)
	var out []store.Project
	err := s.Store.View(ctx, func(tx store.Tx) error {
		if !c.Operator || c.Role != auth.Admin {
			p, err := tx.Project(ctx, c.ProjectID)
			out = []store.Project{p}
			return err
		}
		var err error
		out, err = tx.Projects(ctx)
		return err
	})
	return out, err
}

// Caller returns the caller's project and token, as stored.
func (s *Service) Caller(ctx context.Context) (store.Project, store.Token, error) {
	c, _ := auth.CallerFrom(ctx)
	var (
		p   store.Project
		tok store.Token
	)
	err := s.Store.View(ctx, func(tx store.Tx) error {
		var err error
		if p, err = tx.Project(ctx, c.ProjectID); err != nil {
			return err
		}
		tok, err = tx.Token(ctx, c.TokenID)
		return err
	})
	return p, tok, err
}

// CreateToken creates a token of role in a project the caller manages,
// and returns it with its secret.
func (s *Service) CreateToken(ctx context.Context, projectID string, role auth.Role, name string) (store.Token, string, error) {
	c, err := Admin(ctx)
	if err != nil {
		return store.Token{}, "", err
	}
	if !role.Valid() {
		return store.Token{}, "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("role %s: must be ROLE_VIEWER, ROLE_EDITOR or ROLE_ADMIN", role))
	}
	if len(name) > MaxTokenName || !utf8.ValidString(name) {
		return store.Token{}, "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("name must be valid UTF-8 of at most %d bytes", MaxTokenName))
	}
	var (
		tok    store.Token
		secret string
	)
	err = s.Store.Update(ctx, func(tx store.Tx) error {
		project, err := manages(ctx, tx, c, projectID)
		if err != nil {
			return err
		}
		tok, secret = auth.NewToken(project, role, name, time.Now().UTC())
		return tx.CreateToken(ctx, tok)
	})
	return tok, secret, err
}

// ListTokens returns the tokens of a project the caller manages.
func (s *Service) ListTokens(ctx context.Context, projectID string) ([]store.Token, error) {
	c, err := Admin(ctx)
	if err != nil {
		return nil, err
	}
	var out []store.Token
	err = s.Store.View(ctx, func(tx store.Tx) error {
		project, err := manages(ctx, tx, c, projectID)
		if err != nil {
			return err
		}
		out, err = tx.Tokens(ctx, project)
		return err
	})
	return out, err
}

// RevokeToken revokes a token of a project the caller manages; revoking a
// revoked token returns it unchanged.
func (s *Service) RevokeToken(ctx context.Context, id string) (store.Token, error) {
	c, err := Admin(ctx)
	if err != nil {
		return store.Token{}, err
	}
	var tok store.Token
	err = s.Store.Update(ctx, func(tx store.Tx) error {
		var err error
		tok, err = tx.Token(ctx, id)
		if errors.Is(err, store.ErrNotFound) || err == nil && tok.ProjectID != c.ProjectID && !c.Operator {
			return connect.NewError(connect.CodeNotFound, fmt.Errorf("token %q not found", id))
		}
		if err != nil {
			return err
		}
		if tok.RevokedAt.IsZero() {
			if err := keepsOperatorAdmin(ctx, tx, tok); err != nil {
				return err
			}
			tok.RevokedAt = time.Now().UTC()
			return tx.RevokeToken(ctx, id, tok.RevokedAt)
		}
		return nil
	})
	if err == nil && s.Tokens != nil {
		s.Tokens.Forget(id)
	}
	return tok, err
}

// keepsOperatorAdmin refuses to revoke the operator project's last valid
// admin token: without one, nobody could administer the deployment.
func keepsOperatorAdmin(ctx context.Context, tx store.Tx, tok store.Token) error {
	if auth.Role(tok.Role) != auth.Admin {
		return nil
	}
	p, err := tx.Project(ctx, tok.ProjectID)
	if err != nil || !p.Operator {
		return err
	}
	toks, err := tx.Tokens(ctx, p.ID)
	if err != nil {
		return err
	}
	for _, t := range toks {
		if t.ID != tok.ID && t.RevokedAt.IsZero() && auth.Role(t.Role) == auth.Admin {
			return nil
		}
	}
	return connect.NewError(connect.CodeFailedPrecondition, errors.New(
		"this is the operator project's last valid admin token; create another admin token before revoking it"))
}
