-- A recovery's count (`POST /webhooks/{id}/recover` answers with it) reads
-- the endpoint's failed and held deliveries in the window from this index,
-- rather than every event of the developer in the window. Only deliveries
-- that wait for a recovery are in it (failed ones, and those of disabled
-- endpoints): none of a healthy endpoint's.
--
-- Built under a lock that holds writes to `deliveries` while it scans the
-- table. On a large installation, build it beforehand without that lock:
--   CREATE INDEX CONCURRENTLY deliveries_recoverable ON deliveries
--       (endpoint_id, event_created_at) WHERE state IN ('failed', 'held');
-- and this migration finds it.
CREATE INDEX IF NOT EXISTS deliveries_recoverable ON deliveries (endpoint_id, event_created_at)
    WHERE state IN ('failed', 'held');
