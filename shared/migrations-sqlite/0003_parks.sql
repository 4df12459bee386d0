-- How often the delivery's next attempt was put back without being made (the
-- store failed, the endpoint could not be read, it had no free slot): each
-- park waits longer, and past the limit a delivery parked for a failure is
-- recorded failed. Reset by every recorded outcome.
ALTER TABLE deliveries ADD COLUMN parks INTEGER NOT NULL DEFAULT 0;
