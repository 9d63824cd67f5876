-- Deployment-wide values, such as the key that signs page tokens.
CREATE TABLE settings (
	key   TEXT PRIMARY KEY,
	value BLOB NOT NULL
);

CREATE TABLE projects (
	id         TEXT PRIMARY KEY,
	name       TEXT NOT NULL UNIQUE,
	operator   BOOLEAN NOT NULL,
	created_at INTEGER NOT NULL
);

-- API tokens; only a hash of each secret is kept.
CREATE TABLE tokens (
	id          TEXT PRIMARY KEY,
	project_id  TEXT NOT NULL REFERENCES projects (id),
	role        TEXT NOT NULL,
	name        TEXT NOT NULL,
	secret_hash BLOB NOT NULL,
	created_at  INTEGER NOT NULL,
	revoked_at  INTEGER
);
CREATE INDEX tokens_by_project ON tokens (project_id, id);

-- Idempotency records: one per executed command, written in the command's
-- own transaction.
CREATE TABLE commands (
	project_id   TEXT NOT NULL,
	command_id   TEXT NOT NULL,
	method       TEXT NOT NULL,
	request_hash BLOB NOT NULL,
	response     BLOB NOT NULL,
	created_at   INTEGER NOT NULL,
	PRIMARY KEY (project_id, command_id)
);

-- Egresses and Resolvers: an opaque spec under a revision, labels and
-- annotations under their own revisions. Deleted rows stay as tombstones.
-- IDs are unique within a project (template IDs are chosen by callers);
-- project '' holds the deployment's built-in templates.
CREATE TABLE objects (
	id                   TEXT NOT NULL,
	kind                 TEXT NOT NULL,
	project_id           TEXT NOT NULL,
	spec                 BLOB NOT NULL,
	revision             INTEGER NOT NULL,
	drain_seconds        INTEGER NOT NULL,
	labels               TEXT NOT NULL,
	labels_revision      INTEGER NOT NULL,
	annotations          TEXT NOT NULL,
	annotations_revision INTEGER NOT NULL,
	created_at           INTEGER NOT NULL,
	updated_at           INTEGER NOT NULL,
	deleted_at           INTEGER,
	PRIMARY KEY (project_id, id)
);
CREATE INDEX objects_live ON objects (kind, project_id, id) WHERE deleted_at IS NULL;

-- The labels of live objects and workspaces, one row each, for label
-- selectors.
CREATE TABLE object_labels (
	project_id TEXT NOT NULL,
	object_id  TEXT NOT NULL,
	key        TEXT NOT NULL,
	value      TEXT NOT NULL,
	PRIMARY KEY (project_id, object_id, key)
);
CREATE INDEX object_labels_by_value ON object_labels (key, value, project_id, object_id);

-- What each workspace's network policy references, so that deleting an
-- Egress or Resolver can be refused while one does.
CREATE TABLE policy_references (
	project_id   TEXT NOT NULL,
	workspace_id TEXT NOT NULL,
	kind         TEXT NOT NULL,
	target_id    TEXT NOT NULL,
	PRIMARY KEY (workspace_id, kind, target_id)
);
CREATE INDEX policy_references_by_target ON policy_references (target_id, kind, workspace_id);
