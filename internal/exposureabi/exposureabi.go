// Package exposureabi is what ctrl and hosts agree on about the exposures
// of guest ports: the form of an exposure token and the hash of it that
// ctrl keeps and hosts check, and the forms of an exposure's URL. It
// imports only the standard library.
//
// A token is <exposure_id>.<secret>, where secret is 32 random bytes in
// unpadded base64url; ctrl keeps, and hosts receive, only the token's
// SHA-256.
//
// An exposure's URL is either a path, <endpoint>/x/<exposure_id>/, or,
// when the host has an exposure domain, a host name,
// <port>-<workspace label>.<domain>, where the workspace label is the
// workspace ID with its '_' written as '-' (IDs hold no other '_' or '-').
package exposureabi

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Names a request uses.
const (
	// PathPrefix starts the path of every exposure URL without a domain:
	// PathPrefix + exposure_id + "/".
	PathPrefix = "/x/"
	// TokenParameter is the query parameter that carries a token once.
	TokenParameter = "kibotos_token"
	// CookieName is the cookie that carries a token after that.
	CookieName = "kibotos_exposure"
)

// NewToken returns a new token of an exposure and the hash to keep.
func NewToken(exposureID string) (token string, sum []byte) {
	var b [32]byte
	rand.Read(b[:])
	token = exposureID + "." + base64.RawURLEncoding.EncodeToString(b[:])
	return token, Sum(token)
}

// Sum is the hash kept of a token.
func Sum(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// Verify reports whether token is a token of the exposure whose token
// hashes to sum.
func Verify(token, exposureID string, sum []byte) bool {
	id, secret, ok := strings.Cut(token, ".")
	if !ok || id != exposureID || secret == "" || len(sum) != sha256.Size {
		return false
	}
	return subtle.ConstantTimeCompare(Sum(token), sum) == 1
}

// HostLabel is the first DNS label of an exposure URL by host name.
func HostLabel(port uint32, workspaceID string) string {
	return strconv.FormatUint(uint64(port), 10) + "-" + strings.ReplaceAll(workspaceID, "_", "-")
}

// ParseHostLabel reverses HostLabel; ok is false for a label it did not
// make.
func ParseHostLabel(label string) (port uint32, workspaceID string, ok bool) {
	p, ws, found := strings.Cut(label, "-")
	kind, id, found2 := strings.Cut(ws, "-")
	if !found || !found2 || kind == "" || id == "" || strings.Contains(id, "-") {
		return 0, "", false
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != p {
		return 0, "", false
	}
	return uint32(n), kind + "_" + id, true
}

// URL is the absolute URL of an exposure served by a host that registered
// endpoint (its public base URL) and domain (empty: none).
func URL(endpoint, domain, exposureID, workspaceID string, port uint32) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("host endpoint %q is not an absolute http(s) URL", endpoint)
	}
	if domain == "" {
		return strings.TrimSuffix(endpoint, "/") + PathPrefix + exposureID + "/", nil
	}
	host := HostLabel(port, workspaceID) + "." + domain
	if p := u.Port(); p != "" {
		host += ":" + p
	}
	return (&url.URL{Scheme: u.Scheme, Host: host, Path: "/"}).String(), nil
}
