package sqlstore

import (
	"bytes"
	"maps"
	"sync"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

// maxCachedRows bounds the row cache; past it, an arbitrary row makes room.
const maxCachedRows = 4096

// rowCache keeps the objects and workspaces that reads by ID found, so that
// a read of one (GetEgress, GetWorkspace) costs no statement and no
// transaction. It is only correct where every write to the database passes
// through this process's group commits (Dialect.CacheRows), which drop the
// rows they write.
//
// A generation orders the cache against commits. A commit drops its rows
// and advances the generation just before its COMMIT (beginCommit),
// advances it again just after (endCommit), and no row enters the cache in
// between. A read transaction notes the generation before its snapshot; a
// row it read from the database enters the cache only under that
// generation, so only if no commit ran since the snapshot began. A
// ViewCached is served rows only under its generation too, so the rows it
// is served are of one moment; if a commit starts while it also reads the
// database, it runs again without the cache (Store.ViewCached).
type rowCache struct {
	mu         sync.Mutex
	generation uint64
	committing bool
	rows       map[rowKey]cachedRow
}

// rowKey names a row by project and ID. A row's labels are written only
// with the row (CreateObject, UpdateWorkspace, ...), which drops it.
type rowKey struct{ projectID, id string }

// cachedRow is one object or one workspace.
type cachedRow struct {
	object    *store.Object
	workspace *store.Workspace
}

func newRowCache() *rowCache {
	return &rowCache{rows: make(map[rowKey]cachedRow)}
}

// begin returns the generation a read transaction runs under.
func (c *rowCache) begin() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.generation
}

// current reports whether no commit has started since generation.
func (c *rowCache) current(generation uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.generation == generation
}

// object returns a copy of the cached object, if it is there under
// generation.
func (c *rowCache) object(generation uint64, kind store.Kind, projectID, id string) (store.Object, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	row := c.rows[rowKey{projectID, id}]
	if c.generation != generation || row.object == nil || row.object.Kind != kind {
		return store.Object{}, false
	}
	return copyObject(*row.object), true
}

// workspace returns a copy of the cached workspace, if it is there under
// generation.
func (c *rowCache) workspace(generation uint64, projectID, id string) (store.Workspace, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	row := c.rows[rowKey{projectID, id}]
	if c.generation != generation || row.workspace == nil {
		return store.Workspace{}, false
	}
	return copyWorkspace(*row.workspace), true
}

// put keeps row, read in a transaction that began under generation,
// unless a commit has started since.
func (c *rowCache) put(generation uint64, key rowKey, row cachedRow) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.generation != generation || c.committing {
		return
	}
	if _, ok := c.rows[key]; !ok && len(c.rows) >= maxCachedRows {
		for k := range c.rows {
			delete(c.rows, k)
			break
		}
	}
	c.rows[key] = row
}

// beginCommit is called before a COMMIT that writes the rows of keys:
// they leave the cache, and no row enters it until endCommit, called after
// the COMMIT whether it succeeded or not.
func (c *rowCache) beginCommit(keys map[rowKey]struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.generation++
	c.committing = true
	for k := range keys {
		delete(c.rows, k)
	}
}

func (c *rowCache) endCommit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.generation++
	c.committing = false
}

// copyObject and copyWorkspace copy what a caller could change in place,
// so that neither the cache nor a reader sees another's edits.
func copyObject(o store.Object) store.Object {
	o.Spec = bytes.Clone(o.Spec)
	o.Labels = maps.Clone(o.Labels)
	o.Annotations = maps.Clone(o.Annotations)
	return o
}

func copyWorkspace(w store.Workspace) store.Workspace {
	w.Body = bytes.Clone(w.Body)
	w.Labels = maps.Clone(w.Labels)
	return w
}
