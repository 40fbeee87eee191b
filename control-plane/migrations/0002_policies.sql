-- Policy modules and their rollouts. Portable SQL, as 0001.

-- One row (id = 1): the fleet's policy signing key. It signs every module the control plane
-- accepts; nodes trust its public half. The secret never leaves the service.
CREATE TABLE policy_key (
    id BIGINT PRIMARY KEY,
    secret_text TEXT NOT NULL,
    public_text TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);

-- Module bytes by content hash (base64: the schema holds only BIGINT and TEXT).
CREATE TABLE policy_blobs (
    sha256 TEXT PRIMARY KEY,
    size BIGINT NOT NULL,
    wasm_base64 TEXT NOT NULL
);

-- Uploaded versions: a name and version always mean the same bytes.
CREATE TABLE policy_versions (
    name TEXT NOT NULL,
    version TEXT NOT NULL,
    kind TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size BIGINT NOT NULL,
    signature TEXT NOT NULL,
    uploaded_by TEXT NOT NULL,
    uploaded_at_ms BIGINT NOT NULL,
    PRIMARY KEY (name, version)
);

-- Rollouts. `id` sorts by time (as audit ids). `targets_json` is the ordered list of node ids
-- frozen at the start; `stage` indexes the stages its spec makes over them.
CREATE TABLE rollouts (
    id TEXT PRIMARY KEY,
    policy TEXT NOT NULL,
    version TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    targets_json TEXT NOT NULL,
    state TEXT NOT NULL,
    stage BIGINT NOT NULL,
    reason TEXT,
    -- On completion: the placement it replaced (JSON, or NULL when none), for a rollback.
    replaced_json TEXT,
    created_by TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL
);

CREATE INDEX rollouts_policy ON rollouts (policy, state);

-- Stable versions, one per policy and device selector (the latest completed rollout's).
CREATE TABLE policy_placements (
    policy TEXT NOT NULL,
    selector_key TEXT NOT NULL,
    placement_json TEXT NOT NULL,
    generation BIGINT NOT NULL,
    PRIMARY KEY (policy, selector_key)
);

-- Modules a device reports it could not load.
ALTER TABLE devices ADD COLUMN policy_errors_json TEXT;
