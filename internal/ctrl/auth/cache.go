package auth

import (
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// DefaultCacheTTL is how long an authenticated token is trusted without
// reading the store again. Revoking a token therefore takes effect for
// every call that starts more than this long after the revocation commits,
// on every ctrl replica.
const DefaultCacheTTL = 2 * time.Second

// maxCached bounds the cache; when full it starts over.
const maxCached = 1 << 16

// Cache authenticates through the store and remembers each success for a
// TTL, so that a busy caller costs one token read per TTL rather than one
// per call. Failures are not remembered: a token that does not
// authenticate is read again on its next call.
type Cache struct {
	store store.Store
	ttl   time.Duration
	now   func() time.Time

	mu      sync.Mutex
	entries map[[sha256.Size]byte]cached
	// forgotten counts Forget calls: an answer read before one is not
	// stored, as it may predate the revocation.
	forgotten uint64
}

type cached struct {
	caller  Caller
	expires time.Time
}

// NewCache returns a Cache over s that trusts a success for ttl; a ttl of
// zero or less reads the store on every call.
func NewCache(s store.Store, ttl time.Duration) *Cache {
	return &Cache{store: s, ttl: ttl, now: time.Now, entries: map[[sha256.Size]byte]cached{}}
}

// Authenticate is Authenticate through the cache.
func (c *Cache) Authenticate(ctx context.Context, bearer string) (Caller, error) {
	if c.ttl <= 0 {
		return Authenticate(ctx, c.store, bearer)
	}
	// The key is the whole bearer's hash: a wrong secret for a cached
	// token's ID misses.
	key := sha256.Sum256([]byte(bearer))
	start := c.now()
	c.mu.Lock()
	e, ok := c.entries[key]
	forgotten := c.forgotten
	c.mu.Unlock()
	if ok && start.Before(e.expires) {
		return e.caller, nil
	}
	caller, err := Authenticate(ctx, c.store, bearer)
	if err != nil {
		return caller, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.forgotten != forgotten {
		return caller, nil
	}
	if len(c.entries) >= maxCached {
		clear(c.entries)
	}
	// The entry expires ttl after the read began, so no answer outlives a
	// revocation by more than ttl.
	c.entries[key] = cached{caller: caller, expires: start.Add(c.ttl)}
	return caller, nil
}

// Forget drops a token from the cache, for a revocation made through this
// process: its next call here reads the store.
func (c *Cache) Forget(tokenID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgotten++
	for k, e := range c.entries {
		if e.caller.TokenID == tokenID {
			delete(c.entries, k)
		}
	}
}
