#!/bin/sh
# Compose only (the `secrets` service of deploy/compose.yaml): leaves
# KEY_ENCRYPTION_KEY and INTERNAL_TOKEN as files in the `secrets` volume, where
# with-secrets.sh picks them up for webhooks-api and webhooks-dispatcher.
#
#   - A value given in the environment (from the shell that ran
#     `docker compose up`) is used, and kept for later starts.
#   - Otherwise, in sandbox, the value of an earlier start is kept, or a random
#     one is generated on the first start: DEVELOPMENT ONLY.
#   - With PLATFORM_ENVIRONMENT=production nothing is generated: both values
#     must come from the environment, or this exits non-zero and nothing starts.
#
# The key-encryption key must stay the same for the life of the database
# (endpoint private keys are sealed with it): `docker compose down -v` removes
# the database and this volume together.
set -eu

dir=${SECRETS_DIR:-/run/webhooks-secrets}
owner=${SECRETS_OWNER:-10001:10001}
environment=${PLATFORM_ENVIRONMENT:-sandbox}
umask 077
mkdir -p "$dir"

# 32 random bytes as 64 hex digits: a KEY_ENCRYPTION_KEY the programs accept,
# and a bearer token.
random_hex() { od -An -vtx1 -N32 /dev/urandom | tr -d ' \n'; }

blank() { [ -z "$(printf '%s' "$1" | tr -d '[:space:]')" ]; }

# provide NAME FILE VALUE_FROM_THE_ENVIRONMENT
provide() {
  name=$1 file=$dir/$2 given=$3
  if ! blank "$given"; then
    if [ -s "$file" ] && [ "$(cat "$file")" != "$given" ]; then
      echo "init-secrets: $name from the environment replaces the one kept in the volume" >&2
      [ "$name" = KEY_ENCRYPTION_KEY ] && echo "init-secrets: endpoint keys sealed with a key it no longer lists cannot be opened (the dispatchers refuse to start; see \"Rotating the key-encryption key\" in the README)" >&2
    fi
    printf '%s' "$given" > "$file.new"
    echo "init-secrets: $name taken from the environment"
  elif [ "$environment" = production ]; then
    echo "init-secrets: PLATFORM_ENVIRONMENT=production needs $name from the environment; development values are never generated for production" >&2
    exit 1
  elif [ -s "$file" ]; then
    echo "init-secrets: $name kept from an earlier start"
    return 0
  else
    random_hex > "$file.new"
    echo "init-secrets: $name generated (development only, not for production)"
  fi
  mv "$file.new" "$file"
  chown "$owner" "$file" 2>/dev/null || [ "$(id -u)" != 0 ]
  chmod 0400 "$file"
}

provide KEY_ENCRYPTION_KEY key_encryption_key "${KEY_ENCRYPTION_KEY:-}"
provide INTERNAL_TOKEN internal_token "${INTERNAL_TOKEN:-}"
chown "$owner" "$dir" 2>/dev/null || [ "$(id -u)" != 0 ]
chmod 0700 "$dir"
