-- Exposures of guest ports: the serialized exposure plus what queries
-- select. Ended rows stay as tombstones (ended_at set); a workspace has at
-- most one live exposure per port.
CREATE TABLE exposures (
	id           TEXT PRIMARY KEY,
	project_id   TEXT NOT NULL,
	workspace_id TEXT NOT NULL,
	port         INTEGER NOT NULL,
	persistent   BOOLEAN NOT NULL,
	body         BYTEA NOT NULL,
	created_at   BIGINT NOT NULL,
	ended_at     BIGINT
);
CREATE UNIQUE INDEX exposures_live_port ON exposures (workspace_id, port) WHERE ended_at IS NULL;
CREATE INDEX exposures_live_by_workspace ON exposures (project_id, workspace_id, id) WHERE ended_at IS NULL;
