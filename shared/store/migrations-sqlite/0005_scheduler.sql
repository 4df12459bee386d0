-- The scheduler: see migrations/0009_scheduler.sql of the PostgreSQL store.
-- Here the deliveries table is the queue itself, so an ordered endpoint's
-- later deliveries are simply not claimed before their turn (no `waiting`
-- state), and the pace lives in the one process's memory.
ALTER TABLE endpoints ADD COLUMN rate_limit_per_second INTEGER
    CHECK (rate_limit_per_second BETWEEN 1 AND 10000);
ALTER TABLE endpoints ADD COLUMN ordering TEXT NOT NULL DEFAULT 'none' CHECK (ordering IN ('none', 'ordered'));

ALTER TABLE deliveries ADD COLUMN event_sequence INTEGER;
-- The ticket a paced delivery took in its endpoint's pace, until its attempt.
ALTER TABLE deliveries ADD COLUMN pace_ticket INTEGER;
UPDATE deliveries SET event_sequence = (SELECT e.sequence FROM events e WHERE e.id = deliveries.event_id)
 WHERE state IN ('held', 'pending', 'retrying');
-- The work queue a delivery waits in: `default`, or `bulk` (past its
-- developer's fair share, or recovered), which the queue hands out after
-- `default` and to at most three quarters of the slots.
ALTER TABLE deliveries ADD COLUMN lane TEXT NOT NULL DEFAULT 'default' CHECK (lane IN ('default', 'bulk'));
-- The due scan of each lane; its WHERE must stay the one `claim_due` uses.
CREATE INDEX deliveries_due_by_lane ON deliveries (lane, next_attempt_at, id)
    WHERE state IN ('pending', 'retrying') AND claimed = 0;
CREATE INDEX deliveries_turn ON deliveries (endpoint_id, event_sequence) WHERE state IN ('pending', 'retrying');
