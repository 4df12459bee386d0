#!/usr/bin/env bash
# Compose only: the healthcheck of webhooks-api and webhooks-dispatcher.
#   probe.sh PORT [PATH]   exits 0 when http://127.0.0.1:PORT/PATH (default
#                          /readyz) answers 200 within 5 seconds.
# The image has no curl; bash's /dev/tcp is enough for one GET. The probes
# need no INTERNAL_TOKEN.
set -eu
port=$1
path=${2:-/readyz}
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$path" >&3
status=
IFS= read -r -t 5 status <&3 || true
case "$status" in
  "HTTP/1."?" 200 "*) exit 0 ;;
esac
echo "probe: GET $path on port $port: ${status:-no answer}" >&2
exit 1
