-- Command records are pruned oldest first once past their retention.
CREATE INDEX commands_by_age ON commands (created_at);
