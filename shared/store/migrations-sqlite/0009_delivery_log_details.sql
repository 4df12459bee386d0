-- Logs you can search: see migrations/0016_delivery_log_details.sql of the
-- PostgreSQL store.
ALTER TABLE delivery_attempts ADD COLUMN error_detail TEXT;
