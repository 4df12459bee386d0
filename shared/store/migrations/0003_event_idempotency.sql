-- A producer may send `Idempotency-Key` with `POST /internal/events`: the key
-- (per developer) and the request's fingerprint are kept with the event, so a
-- retried request answers the event it already made instead of a second one.
ALTER TABLE events ADD COLUMN idempotency_key text, ADD COLUMN request_hash bytea;
CREATE UNIQUE INDEX events_idempotency_key ON events (developer_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
