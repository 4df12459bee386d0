-- Logs you can search: what failed, in a short sentence safe to show
-- (`error_detail`). A log's event type is read from its event.
ALTER TABLE delivery_attempts ADD COLUMN error_detail text;
