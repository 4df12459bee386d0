-- The webhooks service schema. Every list the API serves is backed by an index.

-- One row per developer: the per-developer event sequence lives here so that
-- `UPDATE ... RETURNING` serialises concurrent ingests of one developer.
CREATE TABLE developers (
    id                  uuid PRIMARY KEY,
    next_event_sequence bigint      NOT NULL DEFAULT 1,
    created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id           uuid PRIMARY KEY,
    developer_id uuid        NOT NULL,
    key_hash     bytea       NOT NULL UNIQUE,
    kind         text        NOT NULL CHECK (kind IN ('Private', 'Public')),
    prefix       text        NOT NULL,
    last_4       text        NOT NULL,
    state        text        NOT NULL CHECK (state IN ('Active', 'Deleted')),
    scopes       text[]      NOT NULL,
    name         text,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);
CREATE INDEX api_keys_by_developer ON api_keys (developer_id, created_at DESC) WHERE state = 'Active';

-- A stored response per (developer, Idempotency-Key); `status` is NULL while the
-- first request is still running.
CREATE TABLE idempotency_keys (
    developer_id uuid        NOT NULL,
    key          text        NOT NULL,
    fingerprint  bytea       NOT NULL,
    status       smallint,
    body         bytea,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (developer_id, key)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);

CREATE TABLE endpoints (
    id               text PRIMARY KEY,
    developer_id     uuid        NOT NULL,
    url              text        NOT NULL,
    status           text        NOT NULL CHECK (status IN ('active', 'disabled', 'deleted')),
    event_epoch      text        NOT NULL CHECK (event_epoch IN ('webhook_creation', 'beginning_of_time')),
    event_categories text[]      NOT NULL DEFAULT '{}',
    public_key_pem   text        NOT NULL,
    -- self-describing blob: 0x00 + PKCS#8 DER, or 0x01 + AES-256-GCM nonce and ciphertext
    private_key      bytea       NOT NULL,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    deleted_at       timestamptz
);
CREATE INDEX endpoints_by_developer ON endpoints (developer_id, created_at DESC) WHERE status <> 'deleted';

-- The lifecycle record: every state change, when, and by which key.
CREATE TABLE endpoint_changes (
    id           bigserial PRIMARY KEY,
    endpoint_id  text        NOT NULL REFERENCES endpoints (id),
    developer_id uuid        NOT NULL,
    change       text        NOT NULL,
    api_key_id   uuid,
    details      jsonb       NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL
);
CREATE INDEX endpoint_changes_by_endpoint ON endpoint_changes (endpoint_id, id);

-- Broker messages written in the same transaction as the change they announce;
-- a row is deleted once RabbitMQ has confirmed it.
CREATE TABLE outbox (
    id         bigserial PRIMARY KEY,
    exchange   text        NOT NULL,
    routing_key text       NOT NULL,
    payload    bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE events (
    id           text PRIMARY KEY,
    developer_id uuid        NOT NULL,
    sequence     bigint      NOT NULL,
    category     text        NOT NULL,
    -- the exact JSON body POSTed to receivers
    body         text        NOT NULL,
    created_at   timestamptz NOT NULL,
    UNIQUE (developer_id, sequence)
);
CREATE INDEX events_by_developer ON events (developer_id, created_at DESC, id DESC);
CREATE INDEX events_by_developer_category ON events (developer_id, category, created_at DESC, id DESC);

-- One row per event x endpoint it is meant for.
CREATE TABLE deliveries (
    id               bigserial PRIMARY KEY,
    event_id         text        NOT NULL REFERENCES events (id),
    endpoint_id      text        NOT NULL REFERENCES endpoints (id),
    state            text        NOT NULL CHECK (state IN ('held', 'pending', 'retrying', 'succeeded', 'failed', 'cancelled')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    event_created_at timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (endpoint_id, event_id)
);
CREATE INDEX deliveries_upcoming ON deliveries (endpoint_id, event_created_at, id)
    WHERE state IN ('held', 'pending', 'retrying');

-- The delivery log: one row per attempt.
CREATE TABLE delivery_attempts (
    id            uuid PRIMARY KEY,
    delivery_id   bigint      NOT NULL REFERENCES deliveries (id),
    endpoint_id   text        NOT NULL,
    event_id      text        NOT NULL,
    attempt       integer     NOT NULL,
    status        smallint,
    response_body text,
    error         text,
    duration_ms   integer     NOT NULL,
    created_at    timestamptz NOT NULL
);
CREATE INDEX delivery_attempts_by_endpoint ON delivery_attempts (endpoint_id, created_at DESC, id DESC);
