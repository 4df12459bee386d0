-- Portal sessions: see migrations/0015_portal_sessions.sql of the PostgreSQL
-- store. Only the token's SHA-256 is kept.
CREATE TABLE portal_sessions (
    id           TEXT    PRIMARY KEY,
    developer_id TEXT    NOT NULL,
    token_hash   BLOB    NOT NULL UNIQUE,
    scopes       TEXT    NOT NULL CHECK (json_valid(scopes) AND json_type(scopes) = 'array'),
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX portal_sessions_by_expiry ON portal_sessions (expires_at);
