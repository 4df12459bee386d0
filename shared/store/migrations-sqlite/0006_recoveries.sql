-- Recoveries as stored jobs: see migrations/0013_lanes_and_recoveries.sql of
-- the PostgreSQL store. One process holds the data directory, so a lease
-- only matters across its restarts.
CREATE TABLE recoveries (
    id             TEXT    PRIMARY KEY,
    endpoint_id    TEXT    NOT NULL,
    developer_id   TEXT    NOT NULL,
    since          INTEGER NOT NULL,
    until          INTEGER NOT NULL,
    state          TEXT    NOT NULL CHECK (state IN ('running', 'done')),
    total          INTEGER,
    queued         INTEGER NOT NULL DEFAULT 0,
    after_sequence INTEGER NOT NULL DEFAULT 0,
    api_key_id     TEXT,
    owner          TEXT,
    lease_until    INTEGER,
    last_error     TEXT,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    finished_at    INTEGER
) STRICT;
CREATE UNIQUE INDEX recoveries_one_running ON recoveries (endpoint_id) WHERE state = 'running';
CREATE INDEX recoveries_by_endpoint ON recoveries (endpoint_id, created_at DESC);
