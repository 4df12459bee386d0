-- A recovery walks its window as a range of the developer's event sequences,
-- fixed when it starts: `after_sequence` starts before the window's first
-- event, `until_sequence` is its last. Each batch is then one slice of the
-- (developer_id, sequence) index, whatever the planner's statistics say.
ALTER TABLE recoveries ADD COLUMN until_sequence bigint NOT NULL DEFAULT 0;

-- Recoveries running across the upgrade get their range now.
UPDATE recoveries r
   SET until_sequence = coalesce((SELECT max(e.sequence) FROM events e
                                   WHERE e.developer_id = r.developer_id AND e.created_at < r.until), 0),
       after_sequence = greatest(r.after_sequence,
                                 coalesce((SELECT min(e.sequence) - 1 FROM events e
                                            WHERE e.developer_id = r.developer_id
                                              AND e.created_at >= r.since AND e.created_at < r.until), 0))
 WHERE r.state = 'running';
