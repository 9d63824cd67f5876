-- Transfers: the serialized API resource and ctrl's bookkeeping, plus what
-- queries select. host_id names the host an export is assigned to (empty
-- otherwise); pending is true while the transfer waits for work (an
-- export, an import, a restore or a deletion). Deleted rows stay as
-- tombstones and keep their label rows in object_labels.
CREATE TABLE transfers (
	id           TEXT PRIMARY KEY,
	project_id   TEXT NOT NULL,
	body         BLOB NOT NULL,
	host_id      TEXT NOT NULL,
	pending      BOOLEAN NOT NULL,
	expires_at   INTEGER,
	created_at   INTEGER NOT NULL,
	updated_at   INTEGER NOT NULL,
	deleted_at   INTEGER
);
CREATE INDEX transfers_live ON transfers (project_id, id) WHERE deleted_at IS NULL;
CREATE INDEX transfers_by_host ON transfers (host_id) WHERE deleted_at IS NULL;
CREATE INDEX transfers_pending ON transfers (id) WHERE pending;
CREATE INDEX transfers_by_expiry ON transfers (expires_at) WHERE deleted_at IS NULL AND expires_at IS NOT NULL;
