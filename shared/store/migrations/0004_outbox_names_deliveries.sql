-- A delivery's outbox row names the delivery instead of carrying its message:
-- the relay writes the message when it publishes, so the delivery message has
-- one writer. Lifecycle rows (and rows written before this) keep `payload`.
ALTER TABLE outbox
    ALTER COLUMN payload DROP NOT NULL,
    ADD COLUMN delivery_id bigint,
    ADD COLUMN generation integer,
    ADD COLUMN force boolean;
