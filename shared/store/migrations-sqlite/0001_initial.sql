-- The standalone (SQLite) schema: the PostgreSQL schema of `migrations/` as
-- of 0004, without the outbox, with the delivery queue in `deliveries`.
-- uuids are hyphenated TEXT; times are INTEGER microseconds since the Unix
-- epoch, so they order numerically; lists are JSON arrays in TEXT; booleans
-- are INTEGER 0/1. STRICT makes SQLite refuse a value of another type instead
-- of storing it.

-- One row per developer: the per-developer event sequence lives here, bumped
-- in the ingest transaction.
CREATE TABLE developers (
    id                  TEXT    PRIMARY KEY,
    next_event_sequence INTEGER NOT NULL DEFAULT 1,
    created_at          INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
    id           TEXT    PRIMARY KEY,
    developer_id TEXT    NOT NULL,
    key_hash     BLOB    NOT NULL UNIQUE,
    kind         TEXT    NOT NULL CHECK (kind IN ('Private', 'Public')),
    prefix       TEXT    NOT NULL,
    last_4       TEXT    NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('Active', 'Deleted')),
    scopes       TEXT    NOT NULL CHECK (json_valid(scopes) AND json_type(scopes) = 'array'),
    name         TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX api_keys_by_developer ON api_keys (developer_id, created_at DESC, id DESC) WHERE state = 'Active';

-- A stored response per (developer, Idempotency-Key); `status` is NULL while the
-- first request is still running.
CREATE TABLE idempotency_keys (
    developer_id TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    status       INTEGER,
    body         BLOB,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (developer_id, key)
) STRICT;
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);

CREATE TABLE endpoints (
    id               TEXT    PRIMARY KEY,
    developer_id     TEXT    NOT NULL,
    url              TEXT    NOT NULL,
    status           TEXT    NOT NULL CHECK (status IN ('active', 'disabled', 'deleted')),
    event_epoch      TEXT    NOT NULL CHECK (event_epoch IN ('webhook_creation', 'beginning_of_time')),
    event_categories TEXT    NOT NULL DEFAULT '[]'
        CHECK (json_valid(event_categories) AND json_type(event_categories) = 'array'),
    public_key_pem   TEXT    NOT NULL,
    -- self-describing blob: 0x00 + PKCS#8 DER, or 0x01 + AES-256-GCM nonce and ciphertext
    private_key      BLOB    NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    deleted_at       INTEGER
) STRICT;
CREATE INDEX endpoints_by_developer ON endpoints (developer_id, created_at DESC, id DESC) WHERE status <> 'deleted';

-- The lifecycle record: every state change, when, and by which key.
-- AUTOINCREMENT: change ids only grow, even past a deleted row.
CREATE TABLE endpoint_changes (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint_id  TEXT    NOT NULL REFERENCES endpoints (id),
    developer_id TEXT    NOT NULL,
    change       TEXT    NOT NULL,
    api_key_id   TEXT,
    details      TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(details)),
    created_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX endpoint_changes_by_endpoint ON endpoint_changes (endpoint_id, id);

CREATE TABLE events (
    id              TEXT    PRIMARY KEY,
    developer_id    TEXT    NOT NULL,
    sequence        INTEGER NOT NULL,
    category        TEXT    NOT NULL,
    -- the exact JSON body POSTed to receivers
    body            TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    -- a producer's Idempotency-Key and the fingerprint of its request
    idempotency_key TEXT,
    request_hash    BLOB,
    UNIQUE (developer_id, sequence)
) STRICT;
CREATE INDEX events_by_developer ON events (developer_id, created_at DESC, id DESC);
CREATE INDEX events_by_developer_category ON events (developer_id, category, created_at DESC, id DESC);
CREATE UNIQUE INDEX events_idempotency_key ON events (developer_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- One row per event x endpoint it is meant for, and the queue: a delivery is
-- due when it is pending or retrying, unclaimed, and its next attempt time has
-- come. `next_attempt` is the attempt number its next message carries (per
-- generation), `force` whether that message delivers to a disabled endpoint,
-- `claimed` whether a dispatcher holds it now.
-- AUTOINCREMENT: a delivery id named by a stale message never names another.
CREATE TABLE deliveries (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id         TEXT    NOT NULL REFERENCES events (id),
    endpoint_id      TEXT    NOT NULL REFERENCES endpoints (id),
    state            TEXT    NOT NULL
        CHECK (state IN ('held', 'pending', 'retrying', 'succeeded', 'failed', 'cancelled')),
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER,
    event_created_at INTEGER NOT NULL,
    generation       INTEGER NOT NULL DEFAULT 0,
    next_attempt     INTEGER NOT NULL DEFAULT 1,
    force            INTEGER NOT NULL DEFAULT 0 CHECK (force IN (0, 1)),
    claimed          INTEGER NOT NULL DEFAULT 0 CHECK (claimed IN (0, 1)),
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    UNIQUE (endpoint_id, event_id)
) STRICT;
CREATE INDEX deliveries_upcoming ON deliveries (endpoint_id, event_created_at, id)
    WHERE state IN ('held', 'pending', 'retrying');
-- The due scan; its WHERE must stay the one `claim_due` and `next_due_at` use.
CREATE INDEX deliveries_due ON deliveries (next_attempt_at, id)
    WHERE state IN ('pending', 'retrying') AND claimed = 0;

-- The delivery log: one row per attempt.
CREATE TABLE delivery_attempts (
    id            TEXT    PRIMARY KEY,
    delivery_id   INTEGER NOT NULL REFERENCES deliveries (id),
    endpoint_id   TEXT    NOT NULL,
    event_id      TEXT    NOT NULL,
    attempt       INTEGER NOT NULL,
    status        INTEGER,
    response_body TEXT,
    error         TEXT,
    duration_ms   INTEGER NOT NULL,
    created_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX delivery_attempts_by_endpoint ON delivery_attempts (endpoint_id, created_at DESC, id DESC);
