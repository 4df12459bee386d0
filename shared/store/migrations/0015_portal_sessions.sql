-- Portal sessions (`POST /internal/portal_sessions`): a short-lived bearer
-- token that opens the dashboard for one developer. Only the token's SHA-256
-- is kept. A revoked session's row is deleted; expired rows are deleted when
-- the next session is made.
CREATE TABLE portal_sessions (
    id           uuid PRIMARY KEY,
    developer_id uuid        NOT NULL,
    token_hash   bytea       NOT NULL UNIQUE,
    scopes       text[]      NOT NULL,
    created_at   timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL
);
CREATE INDEX portal_sessions_by_expiry ON portal_sessions (expires_at);
