-- Why a recovery queued nothing (nothing failed or upcoming in its window,
-- or what there is still goes out on its own), answered to the call and
-- shown by `GET /webhooks/{id}/recover`. A recovery's `total` is null while
-- it is being counted: the call answers at once, the count comes after.
ALTER TABLE recoveries ADD COLUMN reason text;
