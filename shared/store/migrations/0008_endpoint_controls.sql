-- Endpoint controls (README, "Endpoint controls"): the signature scheme, the
-- key a rotation replaced while it still signs, why the service disabled an
-- endpoint, and each endpoint's delivery health.
ALTER TABLE endpoints
    ADD COLUMN signature_scheme text NOT NULL DEFAULT 'platform'
        CHECK (signature_scheme IN ('platform', 'standard')),
    -- The replaced key, until previous_key_expires_at; all four set or none.
    ADD COLUMN previous_scheme text CHECK (previous_scheme IN ('platform', 'standard')),
    ADD COLUMN previous_public_key text,
    ADD COLUMN previous_private_key bytea,
    ADD COLUMN previous_key_expires_at timestamptz,
    ADD COLUMN disabled_reason text CHECK (disabled_reason IN ('failing'));

-- Housekeeping deletes replaced keys once their overlap ends.
CREATE INDEX endpoints_previous_key_expiry ON endpoints (previous_key_expires_at)
    WHERE previous_key_expires_at IS NOT NULL;

-- Written by the dispatchers with each batch of outcomes; kept apart from
-- endpoints so that the hot path never rewrites the endpoint row.
-- failing_days counts the UTC days (days since 1970) with a failed attempt
-- since failing_since; last_failure_day is the latest of them.
CREATE TABLE endpoint_health (
    endpoint_id      text PRIMARY KEY REFERENCES endpoints (id),
    last_success_at  timestamptz,
    last_failure_at  timestamptz,
    failing_since    timestamptz,
    failing_days     integer NOT NULL DEFAULT 0,
    last_failure_day integer
);
CREATE INDEX endpoint_health_failing ON endpoint_health (failing_since) WHERE failing_since IS NOT NULL;
