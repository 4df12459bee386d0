# Sourced by deploy/image/build and deploy/image/smoke: where things are kept,
# the image names, messages, and the podman settings a machine may need.
# shellcheck shell=bash disable=SC2034

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The debootstrap root, the host's cargo target dir, the staged binaries, the
# podman settings and compose's virtualenv live here between runs.
cache=${WEBHOOKS_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/webhooks/image}
suite=bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

# Local names: podman keeps images built here under localhost/; the service
# image has the name deploy/compose.yaml uses.
base_image=localhost/webhooks-debootstrap:$suite
image=localhost/webhooks:local
postgres_image=localhost/webhooks-postgres:15-$suite
rabbitmq_image=localhost/webhooks-rabbitmq:3.10-$suite
rust_image=localhost/webhooks-rust:$suite

say() { printf '%s: %s\n' "${0##*/}" "$*" >&2; }
die() { say "$*"; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "needs $1 (Debian: apt-get install ${2:-$1})"; }
# Runs a command with its output in $cache/NAME.log, shown only on failure.
logged() {
  local log=$cache/$1.log
  shift
  "$@" >"$log" 2>&1 || { tail -n 30 "$log" >&2; die "failed: $* (whole log: $log)"; }
}
# Seconds since $1 (a `date +%s`), for the timings each step prints.
since() { echo "$(($(date +%s) - $1))s"; }

# Makes `podman run` work on this machine, once the base image exists. Where
# a plain run fails, it tries the two fixes a VM like the project's needs and
# exports CONTAINERS_CONF naming them (export it yourself to run podman by
# hand): runc instead of crun, which refuses cgroup v1 with a cgroup v2
# controller beside it ("cgroups in hybrid mode not supported"), and limits
# no higher than the host's hard ones (podman's defaults exceed them, and
# without CAP_SYS_RESOURCE setrlimit fails). A CONTAINERS_CONF already set is
# used as it is.
podman_settings() {
  local conf=$cache/containers.conf output
  [ -n "${CONTAINERS_CONF:-}" ] && return 0
  if output=$(podman run --rm "$base_image" true 2>&1); then
    return 0
  fi
  local plain=$output
  local nofile nproc
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  # 32768 is podman's own default for builds; above it runc fails here.
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  if [ "$nofile" = unlimited ]; then nofile=1048576; fi
  mkdir -p "$cache"
  {
    echo "# Written by deploy/image (lib.sh, podman_settings): what podman needs on this machine."
    echo "[containers]"
    echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
    if command -v runc >/dev/null 2>&1; then
      echo "[engine]"
      echo "runtime = \"runc\""
    fi
  } >"$conf"
  export CONTAINERS_CONF=$conf
  if ! output=$(podman run --rm "$base_image" true 2>&1); then
    command -v runc >/dev/null 2>&1 || say "runc is not installed (apt-get install runc); crun may be what fails"
    die "podman run fails as installed ($plain), and with $conf too: $output"
  fi
  say "podman run fails as installed ($plain); so CONTAINERS_CONF=$conf: $(grep -v '^[#[]' "$conf" | tr '\n' ' ')"
}
