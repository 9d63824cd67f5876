// Package pagetoken issues and checks the opaque cursors of List calls. A
// token names where the next page starts and is bound to the exact list it
// was issued for (resource kind, project and label selector) by an HMAC
// under a deployment key, so a token replayed with another selector, or
// altered in any byte, is refused.
package pagetoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
)

// ErrInvalid is returned for a token that this list did not issue.
var ErrInvalid = errors.New("page token is not valid for this list: it was issued for another label selector or was altered")

// Codec signs and checks tokens with one deployment-wide key.
type Codec struct {
	key []byte
}

// New returns a Codec; every ctrl replica of a deployment must use the same
// key.
func New(key []byte) *Codec { return &Codec{key: key} }

// Scope identifies one list: what is listed, for whom, under which selector.
type Scope struct {
	Kind      string
	ProjectID string
	Selector  map[string]string
}

// Encode returns the token of the page that starts after the resource ID
// after.
func (c *Codec) Encode(scope Scope, after string) string {
	payload := []byte(after)
	return base64.RawURLEncoding.EncodeToString(append(payload, c.mac(scope, payload)...))
}

// Decode returns the resource ID the page starts after.
func (c *Codec) Decode(scope Scope, token string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) < sha256.Size {
		return "", ErrInvalid
	}
	payload, sum := raw[:len(raw)-sha256.Size], raw[len(raw)-sha256.Size:]
	if !hmac.Equal(sum, c.mac(scope, payload)) {
		return "", ErrInvalid
	}
	return string(payload), nil
}

// mac authenticates payload within scope. Every variable-length field is
// length-prefixed so that no two scopes share an input.
func (c *Codec) mac(scope Scope, payload []byte) []byte {
	h := hmac.New(sha256.New, c.key)
	field := func(s string) {
		h.Write(binary.AppendUvarint(nil, uint64(len(s))))
		h.Write([]byte(s))
	}
	field(scope.Kind)
	field(scope.ProjectID)
	keys := slices.Sorted(maps.Keys(scope.Selector))
	h.Write(binary.AppendUvarint(nil, uint64(len(keys))))
	for _, k := range keys {
		field(k)
		field(scope.Selector[k])
	}
	field(string(payload))
	return h.Sum(nil)
}
