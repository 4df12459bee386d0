-- The processes of the distributed mode (DESIGN.md, "One clock" and
-- "Knowing what is stranded"). Each says once a second that it is alive, in
-- the statement that also measures its clock against the database's; an
-- API also says how far its first attempts are confirmed: every first
-- attempt of an event it committed before `confirmed_through` was
-- confirmed by the broker or written to the outbox.
CREATE TABLE processes (
    id                uuid PRIMARY KEY,
    kind              text        NOT NULL CHECK (kind IN ('api', 'dispatcher')),
    started_at        timestamptz NOT NULL,
    seen_at           timestamptz NOT NULL,
    -- How far the process's host clock is ahead of the database's.
    host_clock_ahead  interval    NOT NULL DEFAULT '0',
    confirmed_through timestamptz
);

-- How far a dispatcher's workers have got in each work queue
-- (`started_through`: the latest `enters_at` of a message a worker
-- started), and what waits in its buffer unstarted (`holding_since`: the
-- earliest `enters_at` there; null when nothing waits).
CREATE TABLE queue_marks (
    process_id      uuid        NOT NULL,
    queue           text        NOT NULL,
    started_through timestamptz,
    holding_since   timestamptz,
    PRIMARY KEY (process_id, queue)
);

-- A delivery the sweeper queued again waits in the swept queue, which
-- dispatchers take first; its outbox row says so to the relay.
ALTER TABLE deliveries ADD COLUMN swept boolean NOT NULL DEFAULT false;
ALTER TABLE outbox ADD COLUMN swept boolean NOT NULL DEFAULT false;

-- The sweep of the swept queue: its owed deliveries by due time (few).
--
-- Built under a lock that holds writes to `deliveries` while it scans the
-- table. On a large installation, build it beforehand without that lock:
--   CREATE INDEX CONCURRENTLY deliveries_swept ON deliveries (next_attempt_at)
--       WHERE swept AND state IN ('pending', 'retrying') AND NOT set_aside;
-- and this migration finds it.
CREATE INDEX IF NOT EXISTS deliveries_swept ON deliveries (next_attempt_at)
    WHERE swept AND state IN ('pending', 'retrying') AND NOT set_aside;

-- Watermarks are on the database's clock from now on: one stamped by a
-- host whose clock ran ahead comes back to now.
UPDATE lane_watermarks SET received_through = least(received_through, now());
