-- Issued data-plane sessions, indexed by ID so that RevokeSession finds a
-- session's workspace. Rows are deleted some time after they expire.
CREATE TABLE sessions (
	project_id   TEXT NOT NULL,
	id           TEXT NOT NULL,
	workspace_id TEXT NOT NULL,
	generation   INTEGER NOT NULL,
	expires_at   INTEGER NOT NULL,
	created_at   INTEGER NOT NULL,
	PRIMARY KEY (project_id, id)
);
CREATE INDEX sessions_by_expiry ON sessions (expires_at);
