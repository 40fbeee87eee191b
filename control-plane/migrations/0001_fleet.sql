-- The control plane's state. Portable SQL: the same file runs on SQLite and PostgreSQL
-- (BIGINT and TEXT only; times are Unix milliseconds; JSON documents are TEXT).

-- One row (id = 1): the fleet CA and the desired-state generation. Every change of desired
-- state raises `generation` in its transaction; on PostgreSQL that row lock also serializes
-- changes made through several `serve` instances.
CREATE TABLE fleet (
    id BIGINT PRIMARY KEY,
    generation BIGINT NOT NULL,
    -- When `generation` was made: revocations of certificates expired by then are dropped
    -- from the revocation list, so every instance computes the same list for a generation.
    changed_at_ms BIGINT NOT NULL,
    ca_cert_pem TEXT NOT NULL,
    -- The CA's private key never leaves the service: no endpoint returns it.
    ca_key_pem TEXT NOT NULL,
    ca_fingerprint TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE api_tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT,
    revoked_at_ms BIGINT
);

CREATE TABLE enrollment_tokens (
    id TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    labels_json TEXT NOT NULL,
    location_json TEXT,
    created_by TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    used_at_ms BIGINT,
    used_by TEXT
);

CREATE TABLE devices (
    node_id TEXT PRIMARY KEY,
    token_id TEXT NOT NULL,
    labels_json TEXT NOT NULL,
    location_json TEXT,
    enrolled_at_ms BIGINT NOT NULL,
    cert_serial TEXT NOT NULL,
    cert_not_after_ms BIGINT NOT NULL,
    revoked_at_ms BIGINT,
    revoked_reason TEXT,
    -- What the device last reported.
    last_seen_ms BIGINT,
    generation_applied BIGINT,
    digest_applied TEXT,
    health TEXT,
    message TEXT,
    apply_error_json TEXT,
    policies_json TEXT
);

CREATE INDEX devices_revoked ON devices (revoked_at_ms);

CREATE TABLE classes (
    name TEXT PRIMARY KEY,
    metric_prefix TEXT NOT NULL UNIQUE,
    spec_json TEXT NOT NULL,
    changed_generation BIGINT NOT NULL
);

CREATE TABLE node_configs (
    name TEXT PRIMARY KEY,
    entry_json TEXT NOT NULL,
    changed_generation BIGINT NOT NULL
);

-- Every change: who, what, when, before and after. `id` sorts by time (zero-padded
-- milliseconds, then a random part), so no sequence is needed on either backend.
CREATE TABLE audit (
    id TEXT PRIMARY KEY,
    at_ms BIGINT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    before_json TEXT,
    after_json TEXT
);
