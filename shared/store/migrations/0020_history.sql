-- History you can search, kept by day (DESIGN.md, "History"; the
-- partitioned tables themselves are made at a new installation's first
-- start, or by `webhooks-api migrate --partition-history` on one with
-- history: see `pg/history.rs`).

-- A delivery log entry carries its event's type, so a search by type is one
-- index; entries written before this get it from their event (the
-- conversion fills it in).
ALTER TABLE delivery_attempts ADD COLUMN event_type text;

-- A producer's Idempotency-Key, for 24 hours: unique per developer across
-- every partition of the events, which no index of a partitioned table can
-- be. `event_id` is the event it made.
CREATE TABLE event_idempotency (
    developer_id uuid        NOT NULL,
    key          text        NOT NULL,
    event_id     text        NOT NULL,
    request_hash bytea       NOT NULL,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (developer_id, key)
);
CREATE INDEX event_idempotency_by_age ON event_idempotency (created_at);

-- Where an installation's history from before partitioning ends (the
-- `legacy` partitions hold what was made before `legacy_before`).
CREATE TABLE history_layout (
    id            boolean PRIMARY KEY DEFAULT true CHECK (id),
    legacy_before timestamptz
);
