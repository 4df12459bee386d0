-- A delivery is found by its event (retention, `send`) and by its endpoint
-- and event: one unique index, event first, serves both, where two served
-- them before. With event ids that grow with time (UUIDv7 hex), inserts go
-- to the index's end instead of a random page. One index fewer to write on
-- every insert of a delivery and every change of its state.
--
-- Builds a unique index over every delivery: on a large database, migrate at
-- a quiet time.
CREATE UNIQUE INDEX deliveries_event_endpoint ON deliveries (event_id, endpoint_id);
ALTER TABLE deliveries DROP CONSTRAINT deliveries_endpoint_id_event_id_key;
DROP INDEX deliveries_by_event;
