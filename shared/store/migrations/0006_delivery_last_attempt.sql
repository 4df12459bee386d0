-- The last attempt recorded for a delivery, and the generation it belongs to
-- (`send` starts a new generation). An outcome of an attempt that is not newer
-- than the last one of the same generation (a duplicate message, a retry
-- chain that forked) changes nothing, and such a retry is dropped: the state
-- never goes backwards. Keyed by generation rather than reset by `send`, so an
-- API from before this column re-arms deliveries correctly during an upgrade.
ALTER TABLE deliveries
    ADD COLUMN last_attempt integer NOT NULL DEFAULT 0,
    ADD COLUMN last_attempt_generation integer NOT NULL DEFAULT 0;
