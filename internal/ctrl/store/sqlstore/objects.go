package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kibotos/kibotos/internal/ctrl/store"
)

const objectColumns = `kind, project_id, id, spec, revision, drain_seconds, labels, labels_revision,
	annotations, annotations_revision, created_at, updated_at, deleted_at`

func (t *tx) CreateObject(ctx context.Context, o store.Object) error {
	labels, annotations, err := encodeMaps(o)
	if err != nil {
		return err
	}
	if _, err := t.exec(ctx, `INSERT INTO objects (`+objectColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		string(o.Kind), o.ProjectID, o.ID, blob(o.Spec), int64(o.Revision), int64(o.DrainSeconds), labels,
		int64(o.LabelsRevision), annotations, int64(o.AnnotationsRevision),
		toNanos(o.CreatedAt), toNanos(o.UpdatedAt), nullNanos(o.DeletedAt)); err != nil {
		return err
	}
	t.touch(o.ProjectID, o.ID)
	return t.indexLabels(ctx, o.ProjectID, o.ID, o.Labels, o.Deleted())
}

func (t *tx) UpdateObject(ctx context.Context, o store.Object) error {
	labels, annotations, err := encodeMaps(o)
	if err != nil {
		return err
	}
	err = mustAffect(t.exec(ctx, `UPDATE objects SET spec = ?, revision = ?, drain_seconds = ?, labels = ?,
		labels_revision = ?, annotations = ?, annotations_revision = ?, updated_at = ?, deleted_at = ?
		WHERE id = ? AND kind = ? AND project_id = ?`,
		blob(o.Spec), int64(o.Revision), int64(o.DrainSeconds), labels, int64(o.LabelsRevision), annotations,
		int64(o.AnnotationsRevision), toNanos(o.UpdatedAt), nullNanos(o.DeletedAt),
		o.ID, string(o.Kind), o.ProjectID))
	if err != nil {
		return err
	}
	t.touch(o.ProjectID, o.ID)
	return t.reindexLabels(ctx, o.ProjectID, o.ID, o.Labels, o.Deleted())
}

// reindexLabels replaces the label rows of an object, workspace or volume.
func (t *tx) reindexLabels(ctx context.Context, projectID, id string, labels map[string]string, deleted bool) error {
	if _, err := t.exec(ctx, `DELETE FROM object_labels WHERE project_id = ? AND object_id = ?`, projectID, id); err != nil {
		return err
	}
	return t.indexLabels(ctx, projectID, id, labels, deleted)
}

// indexLabels writes the rows label selectors query. Deleted objects and
// workspaces have none, since no list returns them; deleted volumes keep
// theirs (their callers pass deleted false) so that Volume returns them.
func (t *tx) indexLabels(ctx context.Context, projectID, id string, labels map[string]string, deleted bool) error {
	if deleted {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if _, err := t.exec(ctx, `INSERT INTO object_labels (project_id, object_id, key, value) VALUES (?, ?, ?, ?)`,
			projectID, id, k, labels[k]); err != nil {
			return err
		}
	}
	return nil
}

// labeledRows runs a query, scans its rows and loads their labels into the
// maps that at points to (loadLabels).
func labeledRows[T any](ctx context.Context, t *tx, scan func(rowScanner) (T, error),
	at func(*T) (projectID, id string, labels *map[string]string), query string, args ...any) ([]T, error) {
	rows, err := t.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	list, err := collect(rows, scan)
	if err != nil {
		return nil, err
	}
	byProject := map[string]map[string]*map[string]string{}
	for i := range list {
		projectID, id, labels := at(&list[i])
		*labels = map[string]string{}
		if byProject[projectID] == nil {
			byProject[projectID] = map[string]*map[string]string{}
		}
		byProject[projectID][id] = labels
	}
	for projectID, byID := range byProject {
		if err := t.loadLabels(ctx, projectID, byID); err != nil {
			return nil, err
		}
	}
	return list, nil
}

// loadLabels reads the label rows of a project's objects, workspaces or
// volumes into the maps of byID, a query per chunk of IDs (inChunks): a
// query per row made each host's assignments (every workspace on it) and
// each page of a list cost a query per row.
func (t *tx) loadLabels(ctx context.Context, projectID string, byID map[string]*map[string]string) error {
	return inChunks(slices.Sorted(maps.Keys(byID)), func(in string, ids []any) error {
		rows, err := t.query(ctx, `SELECT object_id, key, value FROM object_labels
			WHERE project_id = ? AND object_id IN (`+in+`)`, append([]any{projectID}, ids...)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, k, v string
			if err := rows.Scan(&id, &k, &v); err != nil {
				return err
			}
			(*byID[id])[k] = v
		}
		return rows.Err()
	})
}

// inListSizes are the numbers of IDs an IN list of inChunks names: the IDs
// are padded up to the next size, so that a connection keeps a few
// prepared statements for such queries and not one per count.
var inListSizes = []int{1, 10, 100, 1000}

// inChunks calls query with the placeholders of an IN list ("?, ?, …")
// and its arguments for each chunk of ids, padded with the empty string,
// which no ID is.
func inChunks(ids []string, query func(in string, args []any) error) error {
	for chunk := range slices.Chunk(ids, inListSizes[len(inListSizes)-1]) {
		size := inListSizes[slices.IndexFunc(inListSizes, func(n int) bool { return n >= len(chunk) })]
		args := make([]any, size)
		for i := range args {
			args[i] = ""
		}
		for i, id := range chunk {
			args[i] = id
		}
		if err := query("?"+strings.Repeat(", ?", size-1), args); err != nil {
			return err
		}
	}
	return nil
}

// only returns the one row a query by ID found, store.ErrNotFound when it
// found none.
func only[T any](rows []T, err error) (T, error) {
	if err == nil && len(rows) == 0 {
		err = store.ErrNotFound
	}
	if err != nil {
		var zero T
		return zero, err
	}
	return rows[0], nil
}

// livePage returns the query and arguments for one page of live rows of
// table, like Objects: in q.ProjectID, after q.After, carrying q.Selector,
// in ID order, at most q.Limit.
func livePage(table, columns string, q store.ObjectQuery) (string, []any) {
	var b strings.Builder
	b.WriteString(`SELECT ` + columns + ` FROM ` + table + ` o
		WHERE o.project_id = ? AND o.deleted_at IS NULL AND o.id > ?`)
	args := selectorClause(&b, []any{q.ProjectID, q.After}, q.Selector)
	b.WriteString(` ORDER BY o.id LIMIT ?`)
	return b.String(), append(args, q.Limit)
}

// selectorClause appends one EXISTS condition per selector entry on the
// rows aliased o.
func selectorClause(b *strings.Builder, args []any, selector map[string]string) []any {
	for _, k := range slices.Sorted(maps.Keys(selector)) {
		b.WriteString(` AND EXISTS (SELECT 1 FROM object_labels l WHERE l.project_id = o.project_id AND l.object_id = o.id AND l.key = ? AND l.value = ?)`)
		args = append(args, k, selector[k])
	}
	return args
}

func (t *tx) Object(ctx context.Context, kind store.Kind, projectID, id string) (store.Object, error) {
	if t.serveCached {
		if o, ok := t.cache.object(t.generation, kind, projectID, id); ok {
			t.servedFromCache = true
			return o, nil
		}
	}
	o, err := scanObject(t.queryRow(ctx, `SELECT `+objectColumns+` FROM objects
		WHERE id = ? AND kind = ? AND project_id = ?`, id, string(kind), projectID))
	if err == nil && t.cache != nil {
		kept := copyObject(o)
		t.cache.put(t.generation, rowKey{projectID, id}, cachedRow{object: &kept})
	}
	return o, err
}

func (t *tx) Objects(ctx context.Context, q store.ObjectQuery) ([]store.Object, error) {
	var b strings.Builder
	b.WriteString(`SELECT ` + objectColumns + ` FROM objects o
		WHERE o.kind = ? AND o.project_id = ? AND o.deleted_at IS NULL AND o.id > ?`)
	args := []any{string(q.Kind), q.ProjectID, q.After}
	args = selectorClause(&b, args, q.Selector)
	b.WriteString(` ORDER BY o.id LIMIT ?`)
	args = append(args, q.Limit)
	rows, err := t.query(ctx, b.String(), args...)
	if err != nil {
		return nil, err
	}
	return collect(rows, scanObject)
}

func (t *tx) DeletedObjects(ctx context.Context, kind store.Kind, since time.Time) ([]string, error) {
	rows, err := t.query(ctx, `SELECT id FROM objects WHERE kind = ? AND deleted_at IS NOT NULL AND deleted_at > ? ORDER BY id`,
		string(kind), toNanos(since))
	if err != nil {
		return nil, err
	}
	return collect(rows, func(row rowScanner) (string, error) {
		var id string
		return id, row.Scan(&id)
	})
}

func scanObject(row rowScanner) (store.Object, error) {
	var (
		o                                          store.Object
		kind, labels, annotations                  string
		revision, drain, labelsRev, annotationsRev int64
		created, updated                           int64
		deleted                                    sql.NullInt64
	)
	if err := row.Scan(&kind, &o.ProjectID, &o.ID, &o.Spec, &revision, &drain, &labels, &labelsRev,
		&annotations, &annotationsRev, &created, &updated, &deleted); err != nil {
		return store.Object{}, notFound(err)
	}
	if err := json.Unmarshal([]byte(labels), &o.Labels); err != nil {
		return store.Object{}, fmt.Errorf("object %s: labels: %w", o.ID, err)
	}
	if err := json.Unmarshal([]byte(annotations), &o.Annotations); err != nil {
		return store.Object{}, fmt.Errorf("object %s: annotations: %w", o.ID, err)
	}
	o.Kind = store.Kind(kind)
	o.Revision, o.DrainSeconds = uint64(revision), uint32(drain)
	o.LabelsRevision, o.AnnotationsRevision = uint64(labelsRev), uint64(annotationsRev)
	o.CreatedAt, o.UpdatedAt, o.DeletedAt = fromNanos(created), fromNanos(updated), fromNullNanos(deleted)
	return o, nil
}

// encodeMaps renders labels and annotations as JSON objects (never null).
func encodeMaps(o store.Object) (labels, annotations string, err error) {
	enc := func(m map[string]string) (string, error) {
		if m == nil {
			m = map[string]string{}
		}
		b, err := json.Marshal(m)
		return string(b), err
	}
	if labels, err = enc(o.Labels); err != nil {
		return "", "", err
	}
	annotations, err = enc(o.Annotations)
	return labels, annotations, err
}
