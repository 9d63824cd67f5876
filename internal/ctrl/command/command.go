// Package command runs ctrl's mutations with the semantics every service
// shares: a command is identified by its caller-chosen command_id within
// the caller's project; running it again with the same input returns the
// stored response byte for byte, and running it with different input is a
// conflict. The change and the idempotency record commit in one
// transaction, so a command either happened with its record or not at all.
package command

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// MaxIDLength bounds command_id so that records stay small.
const MaxIDLength = 128

// Command is one mutation to run.
type Command[Resp proto.Message] struct {
	// ProjectID scopes the command ID.
	ProjectID string
	// Method is the full procedure name; the same ID on another method is
	// a conflict.
	Method string
	// ID is the caller's command_id.
	ID string
	// Input is the request as far as it decides the outcome: two requests
	// with equal Input (deterministically marshaled) are the same command.
	Input proto.Message
	// New returns an empty response to unmarshal a replay into.
	New func() Resp
}

// Execute is the change a command makes inside the transaction. It returns
// the response to store, or an error that rolls everything back.
type Execute[Resp proto.Message] func(ctx context.Context, tx store.Tx) (Resp, error)

var marshal = proto.MarshalOptions{Deterministic: true}

// ValidateID checks a command_id: required, at most MaxIDLength bytes of
// UTF-8.
func ValidateID(id string) error {
	switch {
	case id == "":
		return errors.New("command.command_id is required")
	case len(id) > MaxIDLength:
		return fmt.Errorf("command.command_id is %d bytes, more than %d", len(id), MaxIDLength)
	case !utf8.ValidString(id):
		return errors.New("command.command_id is not valid UTF-8")
	}
	return nil
}

// Replay returns the stored response when the command already ran with
// this input, connect's already_exists when it ran with another, and
// (zero, false, nil) when it has not run. Callers use it before work that
// must not happen inside a transaction (such as resolving a hostname), so
// that a retry replays even when that work would now answer differently.
func Replay[Resp proto.Message](ctx context.Context, s store.Store, c Command[Resp]) (Resp, bool, error) {
	var (
		resp  Resp
		found bool
	)
	hash, err := inputHash(c)
	if err != nil {
		return resp, false, err
	}
	err = s.View(ctx, func(tx store.Tx) error {
		resp, found, err = lookup(ctx, tx, c, hash)
		return err
	})
	return resp, found, err
}

// Run executes c: inside one transaction it replays or refuses a repeated
// command, or runs exec and records its response.
func Run[Resp proto.Message](ctx context.Context, s store.Store, c Command[Resp], exec Execute[Resp]) (Resp, error) {
	var zero Resp
	hash, err := inputHash(c)
	if err != nil {
		return zero, err
	}
	var resp Resp
	err = s.Update(ctx, func(tx store.Tx) error {
		var found bool
		resp, found, err = lookup(ctx, tx, c, hash)
		if err != nil || found {
			return err
		}
		if resp, err = exec(ctx, tx); err != nil {
			return err
		}
		body, err := marshal.Marshal(resp)
		if err != nil {
			return err
		}
		return tx.PutCommand(ctx, store.Command{
			ProjectID: c.ProjectID, CommandID: c.ID, Method: c.Method,
			RequestHash: hash, Response: body, CreatedAt: time.Now(),
		})
	})
	if err != nil {
		return zero, err
	}
	return resp, nil
}

func lookup[Resp proto.Message](ctx context.Context, tx store.Tx, c Command[Resp], hash []byte) (Resp, bool, error) {
	var zero Resp
	rec, err := tx.Command(ctx, c.ProjectID, c.ID)
	if errors.Is(err, store.ErrNotFound) {
		return zero, false, nil
	}
	if err != nil {
		return zero, false, err
	}
	if rec.Method != c.Method || !bytes.Equal(rec.RequestHash, hash) {
		return zero, false, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf(
			"command_id %q was already used for a different request (%s); use a new command_id for a new command",
			c.ID, rec.Method))
	}
	resp := c.New()
	if err := proto.Unmarshal(rec.Response, resp); err != nil {
		return zero, false, fmt.Errorf("stored response of command %q: %w", c.ID, err)
	}
	return resp, true, nil
}

func inputHash[Resp proto.Message](c Command[Resp]) ([]byte, error) {
	body, err := marshal.Marshal(c.Input)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write([]byte(c.Method))
	h.Write([]byte{0})
	h.Write(body)
	return h.Sum(nil), nil
}

// Aborted is the error of a compare-and-swap that lost: the revision the
// caller observed (expected) is no longer the current one. Nothing changed.
func Aborted(field string, expected, current uint64) error {
	return connect.NewError(connect.CodeAborted, fmt.Errorf(
		"%s is %d, not the expected %d: another change came first; read the current state and retry", field, current, expected))
}
