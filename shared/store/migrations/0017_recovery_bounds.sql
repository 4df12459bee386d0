-- A recovery walks its window as a range of the developer's event sequences,
-- fixed when it starts: `after_sequence` starts before the window's first
-- event, `until_sequence` is its last. Each batch is then one slice of the
-- (developer_id, sequence) index, whatever the planner's statistics say.
-- NULL: started by an API that did not know the range (before this
-- migration, or an older process during a rolling upgrade); its first batch
-- fixes it.
ALTER TABLE recoveries ADD COLUMN until_sequence bigint;
