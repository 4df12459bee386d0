#!/usr/bin/env bash
# Runs the whole system on this machine against the local PostgreSQL and
# RabbitMQ: builds both programs, applies the schema, prints a fresh API key,
# then runs webhooks-api and one webhooks-dispatcher until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/webhooks}"
export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"

cargo build --release --locked --bin webhooks-api --bin webhooks-dispatcher

db_name="${DATABASE_URL##*/}"; db_name="${db_name%%\?*}"
admin_url="${DATABASE_URL%/*}/postgres"
if command -v psql >/dev/null 2>&1; then
  psql "$admin_url" -tAc "SELECT 1 FROM pg_database WHERE datname = '$db_name'" | grep -q 1 \
    || psql "$admin_url" -qc "CREATE DATABASE \"$db_name\""
fi

./target/release/webhooks-api migrate
echo "An unrestricted API key for a new developer (shown once):" >&2
./target/release/webhooks-api keys create --name local
echo >&2

./target/release/webhooks-api serve &
api=$!
./target/release/webhooks-dispatcher &
dispatcher=$!
trap 'kill -TERM $api $dispatcher 2>/dev/null; wait $api $dispatcher' INT TERM
echo "API on ${API_LISTEN_ADDR:-127.0.0.1:8080}, internal on ${INTERNAL_LISTEN_ADDR:-127.0.0.1:8081}, dispatcher on ${DISPATCHER_LISTEN_ADDR:-127.0.0.1:8082}; Ctrl-C stops both." >&2
wait $api $dispatcher
