-- Endpoint controls: see migrations/0008_endpoint_controls.sql of the
-- PostgreSQL store, of which this is the same shape (times in microseconds).
ALTER TABLE endpoints ADD COLUMN signature_scheme TEXT NOT NULL DEFAULT 'platform'
    CHECK (signature_scheme IN ('platform', 'standard'));
ALTER TABLE endpoints ADD COLUMN previous_scheme TEXT CHECK (previous_scheme IN ('platform', 'standard'));
ALTER TABLE endpoints ADD COLUMN previous_public_key TEXT;
ALTER TABLE endpoints ADD COLUMN previous_private_key BLOB;
ALTER TABLE endpoints ADD COLUMN previous_key_expires_at INTEGER;
ALTER TABLE endpoints ADD COLUMN disabled_reason TEXT CHECK (disabled_reason IN ('failing'));
CREATE INDEX endpoints_previous_key_expiry ON endpoints (previous_key_expires_at)
    WHERE previous_key_expires_at IS NOT NULL;

CREATE TABLE endpoint_health (
    endpoint_id      TEXT PRIMARY KEY REFERENCES endpoints (id),
    last_success_at  INTEGER,
    last_failure_at  INTEGER,
    failing_since    INTEGER,
    failing_days     INTEGER NOT NULL DEFAULT 0,
    last_failure_day INTEGER
) STRICT;
CREATE INDEX endpoint_health_failing ON endpoint_health (failing_since) WHERE failing_since IS NOT NULL;
