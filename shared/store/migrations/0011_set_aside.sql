-- Deliveries set aside behind a hanging endpoint (README, "Isolation:
-- adaptive slots"): their message was acked and nothing carries them until
-- the dispatcher that set them aside hears a success from the endpoint, or
-- until their due time, when the sweeper queues them again at once (a
-- set-aside delivery is not stranded: no margin, and it does not count
-- towards the sweep limit).
ALTER TABLE deliveries ADD COLUMN set_aside boolean NOT NULL DEFAULT false;
-- A recovered endpoint's set-aside deliveries, in event order; and those
-- due, which the sweeper takes even while the work queues hold a backlog
-- (when the owed-by-due-time index would walk the whole backlog).
CREATE INDEX deliveries_set_aside ON deliveries (endpoint_id, event_sequence) WHERE set_aside;
CREATE INDEX deliveries_set_aside_due ON deliveries (next_attempt_at) WHERE set_aside;
