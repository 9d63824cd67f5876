-- Launch revisions: each exact launch a host registered, immutable. seq
-- orders them: a platform's default is its revision stored last.
CREATE TABLE launch_revisions (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	id         TEXT NOT NULL UNIQUE,
	platform   TEXT NOT NULL,
	body       BLOB NOT NULL,
	created_at INTEGER NOT NULL
);
CREATE INDEX launch_revisions_platform ON launch_revisions (platform, seq);
