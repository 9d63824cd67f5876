-- Workspaces: the serialized API resource plus what queries select and
-- placement sums. Deleted rows stay as tombstones.
CREATE TABLE workspaces (
	id           TEXT PRIMARY KEY,
	project_id   TEXT NOT NULL,
	template_id  TEXT NOT NULL,
	body         BYTEA NOT NULL,
	host_id      TEXT NOT NULL,
	cpu_millis   BIGINT NOT NULL,
	memory_bytes BIGINT NOT NULL,
	layer_bytes  BIGINT NOT NULL,
	running      BOOLEAN NOT NULL,
	expires_at   BIGINT,
	created_at   BIGINT NOT NULL,
	updated_at   BIGINT NOT NULL,
	deleted_at   BIGINT
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
	body        BYTEA NOT NULL,
	created_at  BIGINT NOT NULL,
	PRIMARY KEY (project_id, template_id, revision)
);

-- Registered hosts and their capacity.
CREATE TABLE hosts (
	id           TEXT PRIMARY KEY,
	body         BYTEA NOT NULL,
	cpu_millis   BIGINT NOT NULL,
	memory_bytes BIGINT NOT NULL,
	layer_bytes  BIGINT NOT NULL,
	seen_at      BIGINT NOT NULL
);
