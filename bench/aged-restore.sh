#!/usr/bin/env bash
# What a repository grown by hourly runs costs to restore from, in
# requests: the newest snapshot of 48 hourly runs (each rewriting three of
# 300 files, so each leaves a small pack, and the first run's packs hold
# what later runs replaced between what the newest snapshot needs),
# restored from MinIO on loopback before and after a prune (which merges
# the small packs), by this build and, with --against, by another capsule
# (the way to say what a change to the read plan did). Requests, packs and
# bytes are counts, the same on a busy machine; seconds are shown but
# only indicative on loopback.
#
#   bench/aged-restore.sh [--against /path/to/capsule] [--hours 48]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
against="" hours=48
while [ $# -gt 0 ]; do
  case $1 in
    --against) against=$2; shift ;;
    --hours) hours=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /var/tmp/capsule-aged.XXXXXX)
use_servers
export AWS_ACCESS_KEY_ID=$CAPSULE_TEST_S3_KEY AWS_SECRET_ACCESS_KEY=$CAPSULE_TEST_S3_SECRET
export CAPSULE_PASSWORD=bench-aged CAPSULE_CACHE_DIR=$work/cache RUST_BACKTRACE=0
export CAPSULE_REPO="s3+http://$CAPSULE_TEST_S3_UPSTREAM/capsule-test/aged-${work##*.}"
"$capsule" init >/dev/null
python3 - "$work/src" <<'PY'
import os, random, sys
r = random.Random(5)
os.makedirs(sys.argv[1])
for i in range(300):
    open(f"{sys.argv[1]}/f{i:03}", "wb").write(r.randbytes(r.randrange(200_000, 2_000_000)))
PY
for h in $(seq 1 "$hours"); do
  python3 - "$work/src" "$h" <<'PY'
import random, sys
r = random.Random(int(sys.argv[2]))
for i in r.sample(range(300), 3):
    open(f"{sys.argv[1]}/f{i:03}", "wb").write(r.randbytes(r.randrange(50_000, 800_000)))
PY
  "$capsule" backup "$work/src" >/dev/null
done
row() { # LABEL BINARY
  rm -rf "$work/out"
  "$2" --json restore latest -t "$work/out" >"$work/r.json"
  diff -r "$work/src" "$work/out$work/src" >/dev/null || { echo "$1: the restore differs from the source" >&2; exit 1; }
  python3 - "$1" "$work/r.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[2])); r = j.get("restore") or j; f = r.get("fetch") or r
print(f"| {sys.argv[1]} | {f['requests']} | {f['packs']} | {f['bytes_fetched'] / 2**20:.1f} | {f['bytes_needed'] / 2**20:.1f} | {r.get('duration_secs', 0):.2f} |")
PY
}
echo "| restore of the newest of $hours hourly runs, from MinIO | requests | packs | MiB fetched | MiB needed | s |"
echo "|---|---:|---:|---:|---:|---:|"
row "this build" "$capsule"
[ -n "$against" ] && row "$(basename "$against")" "$against"
"$capsule" --json prune >"$work/p.json"
merged=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['prune'].get('packs_merged', 0))" "$work/p.json")
row "this build, after a prune ($merged packs merged)" "$capsule"
[ -n "$against" ] && row "$(basename "$against"), after the prune" "$against"
exit 0
