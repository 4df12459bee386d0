-- Retention (RETENTION): sweeps find old events and delivery logs by their
-- age, and deleting an event or a delivery checks (foreign keys) and deletes
-- the rows that name it through an index instead of scanning the table.
CREATE INDEX events_by_age ON events (created_at);
CREATE INDEX delivery_attempts_by_age ON delivery_attempts (created_at);
CREATE INDEX deliveries_by_event ON deliveries (event_id);
CREATE INDEX delivery_attempts_by_delivery ON delivery_attempts (delivery_id);

-- A deleted endpoint keeps no private key: from now on `delete_endpoint`
-- overwrites it, and endpoints deleted before this lose theirs here.
UPDATE endpoints SET private_key = ''::bytea WHERE status = 'deleted';
