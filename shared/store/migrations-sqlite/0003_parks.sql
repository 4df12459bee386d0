-- How often the delivery's next attempt was put back without being made
-- (`parks`: its endpoint had no free slot, or something failed; each park
-- waits longer), and how many of those were for a failure (`failures`: the
-- store failed, the endpoint could not be read; past the limit the delivery
-- is recorded failed). Both reset by every recorded outcome.
ALTER TABLE deliveries ADD COLUMN parks INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deliveries ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
