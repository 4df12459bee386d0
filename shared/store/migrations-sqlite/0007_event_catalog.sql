-- The event catalog (API.md §8.9): the kinds of events. `schema` and
-- `example` keep the operator's JSON text as given.
CREATE TABLE event_types (
    name        TEXT PRIMARY KEY,
    category    TEXT NOT NULL,
    description TEXT NOT NULL,
    schema      TEXT NOT NULL,
    example     TEXT NOT NULL,
    deprecated  INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);

-- Endpoints may narrow to some event types (a JSON list); empty means every
-- type of their categories.
ALTER TABLE endpoints ADD COLUMN event_types TEXT NOT NULL DEFAULT '[]';

-- The type of each event; null for events stored before it was kept.
ALTER TABLE events ADD COLUMN event_type TEXT;
