-- The host token a host registered with: a host ID belongs to it while
-- it is not revoked (empty: registered before this was kept).
ALTER TABLE hosts ADD COLUMN token_id TEXT NOT NULL DEFAULT '';
