-- A recovery walks its window as a range of the developer's event sequences:
-- see migrations/0017_recovery_bounds.sql of the PostgreSQL store.
ALTER TABLE recoveries ADD COLUMN until_sequence INTEGER;
