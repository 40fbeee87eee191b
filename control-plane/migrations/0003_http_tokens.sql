-- Tokens for the nodes' HTTP side (InfluxDB, Prometheus and JSON clients). Portable SQL, as 0001.
-- Only SHA-256 of a secret is stored; nodes receive the id and that hash in their desired state.
CREATE TABLE http_tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    selector_json TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT,
    revoked_at_ms BIGINT
);
