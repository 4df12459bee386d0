-- The sweeper (README, "Nothing stranded, nothing looping") queues again the
-- deliveries that are due with no message carrying them.
--
-- `outbox.attempt`: the attempt number the relay writes into the message it
-- builds (1 when null, as for every row written before this), so a swept
-- delivery continues its retry schedule where it was.
-- `deliveries.sweeps`: how often the sweeper queued the delivery again since
-- an attempt was last recorded; at the limit the delivery is failed instead.
ALTER TABLE outbox ADD COLUMN attempt integer;
ALTER TABLE deliveries ADD COLUMN sweeps integer NOT NULL DEFAULT 0;

-- The sweeper's scan: owed deliveries by due time.
CREATE INDEX deliveries_owed ON deliveries (next_attempt_at)
    WHERE state IN ('pending', 'retrying');
