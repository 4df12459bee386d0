-- A recovery walks its window as a range of the developer's event sequences,
-- fixed by its first batch: `after_sequence` moves to just before the
-- window's first event, `until_sequence` is its last. Each batch is then one
-- slice of the (developer_id, sequence) index, whatever the planner's
-- statistics say. NULL until that first batch, which also covers jobs
-- stored before this migration or by an older API during a rolling upgrade.
ALTER TABLE recoveries ADD COLUMN until_sequence bigint;
