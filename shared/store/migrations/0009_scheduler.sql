-- The scheduler (README, "Scheduling"): each endpoint's pace and order, the
-- lane a queued delivery waits in, and a delivery that waits for its turn.
ALTER TABLE endpoints
    ADD COLUMN rate_limit_per_second integer CHECK (rate_limit_per_second BETWEEN 1 AND 10000),
    ADD COLUMN ordering text NOT NULL DEFAULT 'none' CHECK (ordering IN ('none', 'ordered'));

-- `waiting`: a delivery of an ordered endpoint whose turn has not come; the
-- settling of the delivery before it releases it.
ALTER TABLE deliveries DROP CONSTRAINT deliveries_state_check;
ALTER TABLE deliveries ADD CONSTRAINT deliveries_state_check
    CHECK (state IN ('held', 'pending', 'retrying', 'waiting', 'succeeded', 'failed', 'cancelled'));
-- The event's sequence, so an ordered endpoint's turn is one index probe.
ALTER TABLE deliveries ADD COLUMN event_sequence bigint;

-- The pace of each paced endpoint, shared by every dispatcher: attempts take
-- tickets in order (`tickets`: the next to hand out), and ticket k starts at
-- anchor_at + (k - anchor_ticket) / rate. A 429 or 503 (at `slowed_at`)
-- lowers the rate and moves the anchor to the ticket due then, or to the end
-- of its Retry-After (`paused_until`), so tickets handed out already start
-- later. UNLOGGED: a crash only forgets a schedule that rebuilds itself with
-- the next attempt.
CREATE UNLOGGED TABLE endpoint_pace (
    endpoint_id   text PRIMARY KEY,
    tickets       bigint NOT NULL,
    anchor_ticket double precision NOT NULL,
    anchor_at     timestamptz NOT NULL,
    rate          double precision NOT NULL,
    slowed_at     timestamptz,
    paused_until  timestamptz
);

-- Deliveries still owed get their event's sequence; later ones get it when
-- they are written.
UPDATE deliveries d SET event_sequence = e.sequence
  FROM events e
 WHERE e.id = d.event_id AND d.state IN ('held', 'pending', 'retrying');

-- An ordered endpoint's turn: its unsettled deliveries by sequence.
CREATE INDEX deliveries_turn ON deliveries (endpoint_id, event_sequence)
    WHERE state IN ('pending', 'retrying', 'waiting');

-- Upcoming deliveries include those waiting for their turn.
DROP INDEX deliveries_upcoming;
CREATE INDEX deliveries_upcoming ON deliveries (endpoint_id, event_created_at, id)
    WHERE state IN ('held', 'pending', 'retrying', 'waiting');
