-- The last attempt recorded for a delivery in its current generation (`send`
-- starts a generation at 0). An outcome of an attempt that is not newer than
-- it (a duplicate message, a retry chain that forked) changes nothing, and a
-- retry that is not newer is dropped: the state never goes backwards.
ALTER TABLE deliveries ADD COLUMN last_attempt integer NOT NULL DEFAULT 0;
