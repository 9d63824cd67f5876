-- Launch revisions: each exact launch a host registered, immutable. seq
-- orders them: a platform's default is its revision stored last.
CREATE TABLE launch_revisions (
	seq        BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id         TEXT NOT NULL UNIQUE,
	platform   TEXT NOT NULL,
	body       BYTEA NOT NULL,
	created_at BIGINT NOT NULL
);
CREATE INDEX launch_revisions_platform ON launch_revisions (platform, seq);
