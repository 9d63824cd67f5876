-- Host tokens: what a `kibotos host` authenticates with; only a hash of
-- each secret is kept.
CREATE TABLE host_tokens (
	id          TEXT PRIMARY KEY,
	name        TEXT NOT NULL,
	secret_hash BLOB NOT NULL,
	created_at  INTEGER NOT NULL,
	revoked_at  INTEGER
);

-- lost_at is set while a host's lease has run out; drained hosts take no
-- new placements.
ALTER TABLE hosts ADD COLUMN lost_at INTEGER;
ALTER TABLE hosts ADD COLUMN drained BOOLEAN NOT NULL DEFAULT FALSE;
