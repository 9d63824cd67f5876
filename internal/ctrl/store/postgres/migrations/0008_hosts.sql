-- Host tokens: what a `kibotos host` authenticates with; only a hash of
-- each secret is kept.
CREATE TABLE host_tokens (
	id          TEXT PRIMARY KEY,
	name        TEXT NOT NULL,
	secret_hash BYTEA NOT NULL,
	created_at  BIGINT NOT NULL,
	revoked_at  BIGINT
);

-- lost_at is set while a host's lease has run out; drained hosts take no
-- new placements.
ALTER TABLE hosts ADD COLUMN lost_at BIGINT;
ALTER TABLE hosts ADD COLUMN drained BOOLEAN NOT NULL DEFAULT FALSE;
