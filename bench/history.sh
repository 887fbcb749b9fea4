#!/usr/bin/env bash
# History a stolen credential cannot erase, measured: what object lock
# costs a backup, what its maintenance costs for 100,000 objects, and
# `capsule copy` from a local repository to S3 against `capsule backup` of
# the same tree to the same S3 (and `restic copy` where restic can be
# installed), all at a 2 ms round trip to MinIO through Toxiproxy, in one
# run. Prints Markdown tables (bench/history.py does the work).
#
#   bench/history.sh [--pin] [--data DIR] [--rtt MS] [--objects N]
#
# --data defaults to a copy of ~/.rustup/toolchains; --pin puts the servers
# and the proxy on the last core, as a NAS or object store has CPUs of its
# own (run it both ways). Needs root for apt-get (restic); without it the
# restic row is left out.
set -euo pipefail
cd "$(dirname "$0")/.."

pin_flag=0 args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --pin) pin_flag=1 ;;
    *) args+=("$1") ;;
  esac
  shift
done

if ! command -v restic >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get install -y -qq restic >/dev/null 2>&1 || true
fi
cargo build --release --locked -q -p capsule
work=$(mktemp -d /tmp/capsule-history.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
use_servers
[ "$pin_flag" = 1 ] && pin_servers

rtt=2
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = --rtt ] && rtt=${args[$((i + 1))]}
done
s3_at=$(proxy "history-s3" "$CAPSULE_TEST_S3_UPSTREAM" "$rtt")

CAPSULE_BIN=$PWD/target/release/capsule WORK=$work S3_AT=$s3_at PINNED=$pin_flag \
  MC=${CAPSULE_TOOLS_DIR:-$HOME/.cache/capsule-servers/bin}/mc \
  "${pin[@]}" python3 bench/history.py ${args[@]+"${args[@]}"}
