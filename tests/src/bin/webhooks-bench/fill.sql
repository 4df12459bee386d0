-- One day of history, made in one statement by the bench's history phase.
-- $1: the day, in days before today; $2: its events; $3: the developers
-- (uuid[], the first the big one); $4: the endpoints (text[], twenty per
-- developer in the developers' order; the first is the big endpoint).
-- A third of the events are the first developer's, each delivered to the
-- big endpoint alone; every other event goes to four of its developer's
-- other endpoints. One delivery in a hundred failed after three attempts.
WITH params AS (
    SELECT date_trunc('day', now(), 'UTC') - make_interval(days => $1::int) AS day_start, $2::bigint AS n
), made AS (
    SELECT g, p.day_start + make_interval(secs => g * 86400.0 / p.n) AS at,
           CASE WHEN g % 100 < 31 THEN 0 ELSE 1 + (g % 99)::int END AS dev
      FROM params p, generate_series(0, p.n - 1) g
), ev AS (
    INSERT INTO events (id, developer_id, sequence, category, body, created_at, event_type)
    SELECT e.id, ($3::uuid[])[m.dev + 1], $1::bigint * 10000000 + m.g, 'transfer',
           '{"api_version":"v0","event_id":"' || e.id || '","event_developer_id":"' || ($3::uuid[])[m.dev + 1]
           || '","event_category":"transfer","event_type":"transfer.updated.status_transitioned","event_sequence":'
           || ($1::bigint * 10000000 + m.g) || ',"event_object_id":"tr_' || m.g || '","event_object_status":"payment_processed",'
           || '"event_object":{"id":"tr_' || m.g || '","amount":"100.00","currency":"usd","state":"payment_processed",'
           || '"source":{"payment_rail":"ach","amount":"100.00","currency":"usd"},"destination":{"payment_rail":"polygon",'
           || '"currency":"usdc","to_address":"0x' || md5(e.id) || '"}},"event_object_changes":{"state":["pending",'
           || '"payment_processed"]},"event_created_at":"' || to_char(m.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') || '"}',
           m.at, CASE WHEN m.g % 100 = 37 THEN 'transfer.created' ELSE 'transfer.updated.status_transitioned' END
      FROM made m,
           LATERAL (SELECT 'wh_' || lpad(to_hex(floor(extract(epoch FROM m.at) * 1000)::bigint), 12, '0') || '7'
                           || lpad(to_hex($1::bigint * 10000000 + m.g), 19, '0') AS id) e
    RETURNING id, developer_id, sequence, created_at, event_type
), dl AS (
    INSERT INTO deliveries (event_id, endpoint_id, state, attempts, event_created_at, event_sequence, last_attempt,
                            last_attempt_generation)
    SELECT ev.id, ($4::text[])[t.ep], CASE WHEN (ev.sequence / 100 + t.ep) % 100 = 0 THEN 'failed' ELSE 'succeeded' END,
           CASE WHEN (ev.sequence / 100 + t.ep) % 100 = 0 THEN 3 ELSE 1 END, ev.created_at, ev.sequence,
           CASE WHEN (ev.sequence / 100 + t.ep) % 100 = 0 THEN 3 ELSE 1 END, 0
      FROM ev
      CROSS JOIN LATERAL (
          SELECT 1 AS ep WHERE ev.developer_id = ($3::uuid[])[1]
          UNION ALL
          SELECT d * 20 + 2 + ((ev.sequence + k * 5) % 19)::int
            FROM (SELECT array_position($3::uuid[], ev.developer_id) - 1 AS d) x, generate_series(0, 3) k
           WHERE ev.developer_id <> ($3::uuid[])[1]) t
    RETURNING id, event_id, endpoint_id, state, event_created_at, event_sequence
)
INSERT INTO delivery_attempts (id, delivery_id, endpoint_id, event_id, attempt, status, response_body, error,
                               duration_ms, created_at, event_type)
SELECT (lpad(to_hex(floor(extract(epoch FROM a.at) * 1000)::bigint), 12, '0') || '7' || lpad(to_hex(a.n), 3, '0')
        || '8' || lpad(to_hex(dl.id), 15, '0'))::uuid,
       dl.id, dl.endpoint_id, dl.event_id, a.n, CASE WHEN dl.state = 'failed' THEN 500 ELSE 200 END,
       CASE WHEN dl.state = 'failed' THEN 'internal error' ELSE 'ok' END, NULL, 42, a.at,
       CASE WHEN dl.event_sequence % 100 = 37 THEN 'transfer.created' ELSE 'transfer.updated.status_transitioned' END
  FROM dl CROSS JOIN LATERAL (
      SELECT n, dl.event_created_at + make_interval(secs => (n - 1) * 20) AS at
        FROM generate_series(1, CASE WHEN dl.state = 'failed' THEN 3 ELSE 1 END) n) a;
