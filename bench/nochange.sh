#!/usr/bin/env bash
# The hourly run with nothing changed, guarded against creeping back up.
#
# A copy of /usr/share (about 53,000 entries here, the size of the tree the
# peers' table uses) is backed up once; then --runs no-change runs with
# --no-journal (a full walk: what every run without the daemon's journal
# does). Each run's own time (`duration_secs`: from its start to the
# snapshot stored) and the whole command's wall time are kept; the medians
# are compared with the figure recorded for this machine in
# bench/nochange.recorded. More than 10 % above it prints a banner saying
# REGRESSION and exits 1: the check is in the output, never in a timed test.
#
# With --against BINARY the same runs are made with another capsule too,
# interleaved with this one's (the way to say what a change did).
# With --record the medians become the recorded figure.
#
#   bench/nochange.sh [--runs 7] [--against /path/to/capsule] [--record] [--output FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=7 against="" record="" output=""
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift ;;
    --against) against=$2; shift ;;
    --record) record=1 ;;
    --output) output=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
recorded_file=bench/nochange.recorded
work=$(mktemp -d /var/tmp/capsule-nochange.XXXXXX)
trap 'rm -rf "$work"' EXIT
export CAPSULE_PASSWORD=bench-nochange CAPSULE_CACHE_DIR=$work/cache RUST_BACKTRACE=0

cp -a /usr/share "$work/src"
entries=$(find "$work/src" | wc -l)
"$capsule" -r "$work/repo" init >/dev/null
"$capsule" -r "$work/repo" backup -q "$work/src" >/dev/null
# Warm: every run reads the tree from the page cache.
"$capsule" -r "$work/repo" backup -q --no-journal "$work/src" >/dev/null

# one BINARY: prints "run-seconds wall-seconds" of one no-change run.
one() {
  local t0 t1
  t0=$(date +%s.%N)
  "$1" -r "$work/repo" --json backup --no-journal "$work/src" >"$work/out.json"
  t1=$(date +%s.%N)
  python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
assert d["files_new"] == 0 and d["files_changed"] == 0, "the tree changed between runs"
print(round(d["duration_secs"], 3), round(float(sys.argv[3]) - float(sys.argv[2]), 3))' "$work/out.json" "$t0" "$t1"
}

declare -a mine=() theirs=()
for i in $(seq "$runs"); do
  mine+=("$(one "$capsule")")
  if [ -n "$against" ]; then theirs+=("$(one "$against")"); fi
done

median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
col() { local k=$1; shift; for r in "$@"; do echo "$r" | cut -d' ' -f"$k"; done; }
run_med=$(median $(col 1 "${mine[@]}"))
wall_med=$(median $(col 2 "${mine[@]}"))

recorded_run="" recorded_wall=""
if [ -f "$recorded_file" ]; then
  read -r recorded_run recorded_wall _ <"$recorded_file"
fi
if [ -n "$record" ]; then
  echo "$run_med $wall_med $(date -u +%F) $entries entries, $(nproc) cores" >"$recorded_file"
  recorded_run=$run_med recorded_wall=$wall_med
fi

{
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); capsule $("$capsule" --version | cut -d' ' -f2); $(date -u +%F)"
  echo "Command: bench/nochange.sh --runs $runs${against:+ --against $against}"
  echo "Tree: a copy of /usr/share, $entries entries; no-change runs with --no-journal, warm page cache, medians of $runs"
  echo
  echo "| capsule | the run itself, s (runs) | whole command, s (runs) |"
  echo "|---|---|---|"
  echo "| this build | $run_med ($(col 1 "${mine[@]}" | tr '\n' ' ')) | $wall_med ($(col 2 "${mine[@]}" | tr '\n' ' ')) |"
  if [ -n "$against" ]; then
    echo "| $against | $(median $(col 1 "${theirs[@]}")) ($(col 1 "${theirs[@]}" | tr '\n' ' ')) | $(median $(col 2 "${theirs[@]}")) ($(col 2 "${theirs[@]}" | tr '\n' ' ')) |"
  fi
  if [ -n "$recorded_run" ]; then
    echo "| recorded ($recorded_file) | $recorded_run | $recorded_wall |"
  fi
} | tee "${output:-/dev/null}"

if [ -n "$recorded_run" ] && python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 1.10 * float(sys.argv[2]) else 1)' "$run_med" "$recorded_run"; then
  echo
  echo "################################################################"
  echo "# REGRESSION: the no-change run takes $run_med s against the"
  echo "# recorded $recorded_run s (more than 10 % slower). Profile it:"
  echo "#   perf record -g target/release/capsule -r REPO backup --no-journal SRC"
  echo "################################################################"
  exit 1
fi
