-- Knowing which due deliveries no queue holds (DESIGN.md, "Knowing what is
-- stranded"): each delivery's lane, and how far each lane's consumers have
-- got. `received_through` is the latest `enters_at` of any message a
-- dispatcher received from the lane: every message that entered the lane
-- before it has been handed out.
ALTER TABLE deliveries ADD COLUMN lane text NOT NULL DEFAULT 'default' CHECK (lane IN ('default', 'bulk'));
CREATE TABLE lane_watermarks (
    lane             text PRIMARY KEY CHECK (lane IN ('default', 'bulk')),
    received_through timestamptz NOT NULL
);
INSERT INTO lane_watermarks (lane, received_through) VALUES ('default', '-infinity'), ('bulk', '-infinity');

-- The sweeper's scan: owed deliveries of a lane by due time, set-aside ones
-- apart (they have their own index).
CREATE INDEX deliveries_owed_by_lane ON deliveries (lane, next_attempt_at)
    WHERE state IN ('pending', 'retrying') AND NOT set_aside;
DROP INDEX deliveries_owed;

-- The stalled-turn net walks the endpoints with waiting deliveries by id.
CREATE INDEX deliveries_waiting ON deliveries (endpoint_id) WHERE state = 'waiting';

-- Recoveries (`POST /v0/webhooks/{id}/recover`) are jobs: stored, resumed
-- after a restart, one running per endpoint. `after_sequence` is the last
-- event sequence done; a worker (`owner`, one per API process) holds a
-- running job until `lease_until`.
CREATE TABLE recoveries (
    id             uuid PRIMARY KEY,
    endpoint_id    text NOT NULL,
    developer_id   uuid NOT NULL,
    since          timestamptz NOT NULL,
    until          timestamptz NOT NULL,
    state          text NOT NULL CHECK (state IN ('running', 'done')),
    total          bigint,
    queued         bigint NOT NULL DEFAULT 0,
    after_sequence bigint NOT NULL DEFAULT 0,
    api_key_id     uuid,
    owner          uuid,
    lease_until    timestamptz,
    last_error     text,
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    finished_at    timestamptz
);
CREATE UNIQUE INDEX recoveries_one_running ON recoveries (endpoint_id) WHERE state = 'running';
CREATE INDEX recoveries_by_endpoint ON recoveries (endpoint_id, created_at DESC);
