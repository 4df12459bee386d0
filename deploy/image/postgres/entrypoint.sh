#!/bin/sh
# Starts PostgreSQL in the foreground as the postgres user, listening on all
# addresses with password authentication. On the first start (an empty
# PGDATA) it makes the cluster with the superuser POSTGRES_USER (password
# POSTGRES_PASSWORD) and the database POSTGRES_DB, as the official image does.
set -eu
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

install -d -o postgres -g postgres -m 0700 "$PGDATA"
install -d -o postgres -g postgres -m 2775 /run/postgresql
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  [ -n "${POSTGRES_PASSWORD:-}" ] || { echo "postgres-entrypoint: POSTGRES_PASSWORD is required" >&2; exit 1; }
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  chown postgres "$pwfile"
  as_postgres initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [ "$db" != postgres ]; then
    echo "CREATE DATABASE \"$db\" OWNER \"$user\"" | as_postgres postgres --single -D "$PGDATA" postgres >/dev/null
  fi
  echo "postgres-entrypoint: made the cluster in $PGDATA (user $user, database $db)"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" "$@"
