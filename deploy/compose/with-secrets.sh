#!/bin/sh
# Compose only: the entrypoint of webhooks-api and webhooks-dispatcher in
# deploy/compose.yaml. Exports the secrets init-secrets.sh left in the
# `secrets` volume (the programs read environment variables, not files), then
# runs the program given as arguments in place of this shell.
set -eu
dir=${SECRETS_DIR:-/run/webhooks-secrets}
KEY_ENCRYPTION_KEY=$(cat "$dir/key_encryption_key")
export KEY_ENCRYPTION_KEY
case "${1:-}" in
  webhooks-api)
    INTERNAL_TOKEN=$(cat "$dir/internal_token")
    export INTERNAL_TOKEN
    ;;
esac
exec "$@"
