-- Rows of deleted resources, ended exposures and revoked tokens are
-- pruned oldest first once past the retention of command records
-- (PruneDeleted), with what is keyed by their IDs: an exposure's and a
-- session's workspace among it.
CREATE INDEX workspaces_deleted ON workspaces (deleted_at) WHERE deleted_at IS NOT NULL;
CREATE INDEX volumes_deleted ON volumes (deleted_at) WHERE deleted_at IS NOT NULL;
CREATE INDEX transfers_deleted ON transfers (deleted_at) WHERE deleted_at IS NOT NULL;
CREATE INDEX objects_by_deletion ON objects (deleted_at) WHERE deleted_at IS NOT NULL;
CREATE INDEX exposures_ended ON exposures (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX exposures_by_workspace ON exposures (workspace_id);
CREATE INDEX sessions_by_workspace ON sessions (workspace_id);
CREATE INDEX tokens_revoked ON tokens (revoked_at) WHERE revoked_at IS NOT NULL;
CREATE INDEX host_tokens_revoked ON host_tokens (revoked_at) WHERE revoked_at IS NOT NULL;
