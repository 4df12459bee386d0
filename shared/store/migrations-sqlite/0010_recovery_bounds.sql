-- A recovery walks its window as a range of the developer's event sequences:
-- see migrations/0017_recovery_bounds.sql of the PostgreSQL store.
ALTER TABLE recoveries ADD COLUMN until_sequence INTEGER NOT NULL DEFAULT 0;

UPDATE recoveries
   SET until_sequence = coalesce((SELECT max(e.sequence) FROM events e
                                   WHERE e.developer_id = recoveries.developer_id AND e.created_at < recoveries.until), 0),
       after_sequence = max(after_sequence,
                            coalesce((SELECT min(e.sequence) - 1 FROM events e
                                       WHERE e.developer_id = recoveries.developer_id
                                         AND e.created_at >= recoveries.since AND e.created_at < recoveries.until), 0))
 WHERE state = 'running';
