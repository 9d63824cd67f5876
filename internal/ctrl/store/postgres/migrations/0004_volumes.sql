-- Volumes: the serialized API resource plus what queries select. Deleted
-- rows stay as tombstones and, unlike workspaces', keep their label rows
-- in object_labels; lists skip them by deleted_at.
CREATE TABLE volumes (
	id           TEXT PRIMARY KEY,
	project_id   TEXT NOT NULL,
	body         BYTEA NOT NULL,
	host_id      TEXT NOT NULL,
	pool         TEXT NOT NULL,
	workspace_id TEXT NOT NULL,
	created_at   BIGINT NOT NULL,
	updated_at   BIGINT NOT NULL,
	deleted_at   BIGINT
);
CREATE INDEX volumes_live ON volumes (project_id, id) WHERE deleted_at IS NULL;
CREATE INDEX volumes_by_host ON volumes (host_id) WHERE deleted_at IS NULL;
CREATE INDEX volumes_by_pool ON volumes (pool) WHERE deleted_at IS NULL;
