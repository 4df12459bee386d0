-- Why a recovery queued nothing (see the PostgreSQL migration 0021).
ALTER TABLE recoveries ADD COLUMN reason TEXT;
