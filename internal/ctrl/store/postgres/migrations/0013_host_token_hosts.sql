-- The host IDs a host token may register (space-separated, sorted), or
-- any_host. Tokens issued before this was kept go on registering any host.
ALTER TABLE host_tokens ADD COLUMN host_ids TEXT NOT NULL DEFAULT '';
ALTER TABLE host_tokens ADD COLUMN any_host BOOLEAN NOT NULL DEFAULT TRUE;
