// Package sessiontoken mints and checks data-plane session tokens. It needs
// nothing but the workspace's data-plane key, so a host's gateway checks a
// token without calling ctrl, and it imports only the standard library.
//
// A token is five dot-separated fields:
//
//	<session_id>.<workspace_id>.<generation>.<expires_at>.<mac>
//
// generation and expires_at (Unix seconds) are decimal without leading
// zeros; mac is the unpadded base64url HMAC-SHA256, under the workspace's
// 32-byte data-plane key, of
//
//	"kibotos.session.v1" 0x00 session_id 0x00 workspace_id 0x00 generation 0x00 expires_at
//
// IDs never contain a dot or a NUL, so the fields cannot be confused.
package sessiontoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"
)

// KeySize is the size of a data-plane key.
const KeySize = 32

// domain separates these MACs from any other use of the key.
const domain = "kibotos.session.v1"

// maxLength bounds a token, so that parsing garbage stays cheap.
const maxLength = 512

var (
	// ErrInvalid is returned for a malformed token, a MAC that does not
	// verify, or a token of another execution (another workspace or
	// generation). The cases are not told apart.
	ErrInvalid = errors.New("invalid session token")
	// ErrExpired is returned for an authentic token past its expiry.
	ErrExpired = errors.New("session expired")
	// ErrRevoked is returned for an authentic token whose session was
	// revoked.
	ErrRevoked = errors.New("session revoked")
)

// Claims is what a token asserts.
type Claims struct {
	SessionID   string
	WorkspaceID string
	// Generation is the workspace generation the session works for.
	Generation uint64
	// ExpiresAt has a precision of one second.
	ExpiresAt time.Time
}

// Sign returns the token of claims under key.
func Sign(key []byte, c Claims) string {
	body := c.SessionID + "." + c.WorkspaceID + "." + strconv.FormatUint(c.Generation, 10) + "." +
		strconv.FormatInt(c.ExpiresAt.Unix(), 10)
	return body + "." + base64.RawURLEncoding.EncodeToString(mac(key, c))
}

func mac(key []byte, c Claims) []byte {
	h := hmac.New(sha256.New, key)
	for i, f := range []string{domain, c.SessionID, c.WorkspaceID, strconv.FormatUint(c.Generation, 10), strconv.FormatInt(c.ExpiresAt.Unix(), 10)} {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write([]byte(f))
	}
	return h.Sum(nil)
}

// Token is a parsed, not yet verified token.
type Token struct {
	Claims
	mac []byte
}

// Parse checks a token's shape and returns its claims, unverified: only
// Verify tells whether they are true. A malformed token is ErrInvalid.
func Parse(s string) (Token, error) {
	if len(s) > maxLength {
		return Token{}, ErrInvalid
	}
	f := strings.Split(s, ".")
	if len(f) != 5 || f[0] == "" || f[1] == "" || strings.ContainsRune(s, 0) {
		return Token{}, ErrInvalid
	}
	gen, err := strconv.ParseUint(f[2], 10, 64)
	if err != nil || strconv.FormatUint(gen, 10) != f[2] {
		return Token{}, ErrInvalid
	}
	exp, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil || strconv.FormatInt(exp, 10) != f[3] {
		return Token{}, ErrInvalid
	}
	m, err := base64.RawURLEncoding.DecodeString(f[4])
	if err != nil || len(m) != sha256.Size {
		return Token{}, ErrInvalid
	}
	return Token{Claims: Claims{SessionID: f[0], WorkspaceID: f[1], Generation: gen, ExpiresAt: time.Unix(exp, 0).UTC()}, mac: m}, nil
}

// Authority is what a verifier knows of the execution a token is presented
// to: the data-plane key and revocations of its workspace, and its
// generation.
type Authority struct {
	WorkspaceID string
	Generation  uint64
	Key         []byte
	Revoked     []string
}

// Verify checks the token against the execution: ErrInvalid unless the MAC
// verifies under a.Key (an empty key verifies nothing) and the token names
// a's workspace and generation; then ErrExpired once now reaches
// ExpiresAt, and ErrRevoked for a revoked session.
func (t Token) Verify(a Authority, now time.Time) error {
	if len(a.Key) == 0 || !hmac.Equal(t.mac, mac(a.Key, t.Claims)) ||
		t.WorkspaceID != a.WorkspaceID || t.Generation != a.Generation {
		return ErrInvalid
	}
	if !now.Before(t.ExpiresAt) {
		return ErrExpired
	}
	if slices.Contains(a.Revoked, t.SessionID) {
		return ErrRevoked
	}
	return nil
}
