-- The API token that issued each session, so that revoking the token
-- revokes the sessions it issued. Sessions issued before this have none.
ALTER TABLE sessions ADD COLUMN token_id TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_by_token ON sessions (token_id, expires_at);
