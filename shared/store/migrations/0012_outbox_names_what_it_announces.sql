-- An outbox row says what it announces, not where it goes: a delivery's
-- lane, or the endpoint change (`endpoint_changes.id`). The relay knows the
-- queue and exchange names; rows written before this keep their exchange,
-- routing key and, for lifecycle messages, their payload.
ALTER TABLE outbox
    ADD COLUMN lane text CHECK (lane IN ('default', 'bulk')),
    ADD COLUMN change_id bigint;

-- A relay claims rows for a while instead of holding them locked in a
-- transaction across the broker's confirms; rows of a relay that stopped
-- are claimed again once the claim lapses.
ALTER TABLE outbox ADD COLUMN claimed_until timestamptz;
