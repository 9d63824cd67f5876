-- Objects by when they were deleted: the hosts hear of Egresses deleted
-- within the longest drain, to close the connections still draining
-- through them.
CREATE INDEX objects_deleted ON objects (kind, deleted_at) WHERE deleted_at IS NOT NULL;
