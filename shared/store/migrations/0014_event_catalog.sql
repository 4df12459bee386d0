-- The event catalog (API.md §8.9): the kinds of events, as data every API
-- process and dispatcher reads. `schema` and `example` keep the operator's
-- JSON text as given.
CREATE TABLE event_types (
    name        text PRIMARY KEY,
    category    text NOT NULL,
    description text NOT NULL,
    schema      text NOT NULL,
    example     text NOT NULL,
    deprecated  boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- Endpoints may narrow to some event types; empty means every type of their
-- categories.
ALTER TABLE endpoints ADD COLUMN event_types text[] NOT NULL DEFAULT '{}';

-- The type of each event, for that narrowing in SQL; null for events stored
-- before it was kept (they match every type).
ALTER TABLE events ADD COLUMN event_type text;
