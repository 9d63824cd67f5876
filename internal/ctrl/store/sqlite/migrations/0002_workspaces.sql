-- Workspaces: the serialized API resource plus what queries select and
-- placement sums. Deleted rows stay as tombstones.
CREATE TABLE workspaces (
	id           TEXT PRIMARY KEY,
	project_id   TEXT NOT NULL,
	template_id  TEXT NOT NULL,
	body         BLOB NOT NULL,
	host_id      TEXT NOT NULL,
	cpu_millis   INTEGER NOT NULL,
	memory_bytes INTEGER NOT NULL,
	layer_bytes  INTEGER NOT NULL,
	running      BOOLEAN NOT NULL,
	expires_at   INTEGER,
	created_at   INTEGER NOT NULL,
	updated_at   INTEGER NOT NULL,
	deleted_at   INTEGER
);
CREATE INDEX workspaces_live ON workspaces (project_id, id) WHERE deleted_at IS NULL;
CREATE INDEX workspaces_by_host ON workspaces (host_id) WHERE deleted_at IS NULL;
CREATE INDEX workspaces_by_template ON workspaces (project_id, template_id) WHERE deleted_at IS NULL;
CREATE INDEX workspaces_by_expiry ON workspaces (expires_at) WHERE deleted_at IS NULL AND expires_at IS NOT NULL;

-- Immutable imported template revisions.
CREATE TABLE template_revisions (
	project_id  TEXT NOT NULL,
	template_id TEXT NOT NULL,
	revision    TEXT NOT NULL,
	body        BLOB NOT NULL,
	created_at  INTEGER NOT NULL,
	PRIMARY KEY (project_id, template_id, revision)
);

-- Registered hosts and their capacity.
CREATE TABLE hosts (
	id           TEXT PRIMARY KEY,
	body         BLOB NOT NULL,
	cpu_millis   INTEGER NOT NULL,
	memory_bytes INTEGER NOT NULL,
	layer_bytes  INTEGER NOT NULL,
	seen_at      INTEGER NOT NULL
);
