package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/kibotos/kibotos/sdk"
)

// The data-plane verbs (ws exec, cp, ps, logs, top, port-forward, screen,
// input) keep the session they used in a file of the user's cache
// directory, one per server URL, API token and workspace, and the next
// invocation for the same three reuses it instead of issuing a session:
// while it is valid, a command makes no call to the control plane. The SDK
// replaces a session that is about to expire or that the data plane
// refuses (a restart of the workspace, a revocation), and the file gets
// the new one. The token is part of the key so that a session issued with
// one API token never serves a command given another.

// envSessionCache overrides the session cache's directory; "off" turns
// the cache off.
const envSessionCache = "KIBOTOS_SESSION_CACHE"

// sessionCache is the directory of cached sessions; the zero value caches
// nothing.
type sessionCache struct {
	dir string
}

// openSessionCache returns the session cache: $KIBOTOS_SESSION_CACHE, or
// kibotos/sessions under the user's cache directory ($XDG_CACHE_HOME or
// ~/.cache).
func openSessionCache() sessionCache {
	dir := os.Getenv(envSessionCache)
	switch dir {
	case "off":
		return sessionCache{}
	case "":
		base, err := os.UserCacheDir()
		if err != nil {
			return sessionCache{}
		}
		dir = filepath.Join(base, "kibotos", "sessions")
	}
	return sessionCache{dir: dir}
}

// cachedSession is the file's content.
type cachedSession struct {
	ID        string    `json:"id"`
	Token     string    `json:"token"`
	Endpoint  string    `json:"endpoint"`
	ExpiresAt time.Time `json:"expires_at"`
}

// path returns the file of the session of workspace id at baseURL with
// the API token.
func (c sessionCache) path(baseURL, token, id string) string {
	sum := sha256.Sum256([]byte(baseURL + "\x00" + token + "\x00" + id))
	return filepath.Join(c.dir, hex.EncodeToString(sum[:16])+".json")
}

// load returns the cached session, or nil when there is none, it is
// unreadable, or it has expired.
func (c sessionCache) load(baseURL, token, id string) *sdk.Session {
	if c.dir == "" {
		return nil
	}
	b, err := os.ReadFile(c.path(baseURL, token, id))
	if err != nil {
		return nil
	}
	var s cachedSession
	if json.Unmarshal(b, &s) != nil || s.Token == "" || s.Endpoint == "" ||
		(!s.ExpiresAt.IsZero() && time.Now().After(s.ExpiresAt)) {
		return nil
	}
	return &sdk.Session{ID: s.ID, Token: s.Token, Endpoint: s.Endpoint, ExpiresAt: s.ExpiresAt}
}

// store keeps s, readable only by the user (0600 in a 0700 directory),
// replacing the file whole; a nil s removes it. It is best effort: a
// command does not fail for its cache.
func (c sessionCache) store(baseURL, token, id string, s *sdk.Session) {
	if c.dir == "" {
		return
	}
	path := c.path(baseURL, token, id)
	if s == nil {
		os.Remove(path)
		return
	}
	b, err := json.Marshal(cachedSession{ID: s.ID, Token: s.Token, Endpoint: s.Endpoint, ExpiresAt: s.ExpiresAt})
	if err != nil || os.MkdirAll(c.dir, 0o700) != nil {
		return
	}
	f, err := os.CreateTemp(c.dir, ".session-*")
	if err != nil {
		return
	}
	_, err = f.Write(b)
	err = errors.Join(err, f.Close()) // CreateTemp makes the file 0600
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
}
