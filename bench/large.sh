#!/usr/bin/env bash
# Large files: a restore of N files of SIZE from a local repository against
# the disk's sequential write speed (`dd conv=fsync`), measured in the same
# run on the same filesystem, with restic beside it.
#
#   bench/large.sh [--files N] [--gib SIZE] [--output FILE]
#
# Defaults: 4 files of 2 GiB of random data (8 GiB; about 34 GiB of free
# space are needed for the source, two repositories, the output and dd's
# file). Every restore is followed by `sync` inside the timed span, so
# what it left in the page cache is counted as dd's fsync is; the page
# cache is dropped before each (as root) so the repository is read from
# disk, as it would be after a reboot.
set -euo pipefail
cd "$(dirname "$0")/.."

files=4 gib=2 output=""
while [ $# -gt 0 ]; do
  case "$1" in
    --files) files=$2; shift ;;
    --gib) gib=$2; shift ;;
    --output) output=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
command -v restic >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq restic >/dev/null
}
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/capsule-large.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CAPSULE_PASSWORD=bench RESTIC_PASSWORD=bench

drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
# timed CMD...: wall seconds of CMD followed by sync, in $last; peak RSS in $rss
timed() {
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$work/rss" "$@" >"$work/last.log" 2>&1 || {
    tail -5 "$work/last.log" >&2
    exit 1
  }
  sync
  t1=$(date +%s.%N)
  last=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$t1")
  rss=$(($(cat "$work/rss") / 1024))
}
mbs() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 1e6 / float(sys.argv[2]):.0f}')" "$@"; }

mkdir -p "$work/src"
for ((i = 0; i < files; i++)); do
  head -c "${gib}G" /dev/urandom >"$work/src/big$i.bin"
done
bytes=$(du -sb "$work/src" | cut -f1)

# The disk's sequential write speed, as dd sees it with one fsync at the end.
drop
t0=$(date +%s.%N)
dd if=/dev/zero of="$work/dd.bin" bs=16M count=$((bytes / 16777216)) conv=fsync status=none
t1=$(date +%s.%N)
dd_s=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$t1")
rm -f "$work/dd.bin"
rows=("dd if=/dev/zero conv=fsync (the disk)|$dd_s|$(mbs "$bytes" "$dd_s")|—|100%")

"$capsule" -r "$work/capsule-repo" -q init
"$capsule" -r "$work/capsule-repo" -q backup "$work/src"
drop
timed "$capsule" -r "$work/capsule-repo" --no-cache -q restore latest --target "$work/out"
cmp -s "$work/src/big0.bin" "$work/out$work/src/big0.bin" || { echo "capsule restored wrong data" >&2; exit 1; }
rows+=("capsule restore + sync|$last|$(mbs "$bytes" "$last")|$rss|$(python3 -c "print(f'{100 * $dd_s / $last:.0f}%')")")
rm -rf "$work/out" "$work/capsule-repo"

restic -r "$work/restic-repo" init -q >/dev/null
restic -r "$work/restic-repo" backup -q "$work/src" >/dev/null
drop
timed restic -r "$work/restic-repo" restore latest -q --target "$work/out"
cmp -s "$work/src/big0.bin" "$work/out$work/src/big0.bin" || { echo "restic restored wrong data" >&2; exit 1; }
rows+=("$(restic version | cut -d' ' -f1,2) restore + sync|$last|$(mbs "$bytes" "$last")|$rss|$(python3 -c "print(f'{100 * $dd_s / $last:.0f}%')")")
rm -rf "$work/out" "$work/restic-repo"

{
  echo "Data: $files × $gib GiB of random data. Machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; $(df -T "$work" | awk 'NR==2 {print $2}') on $(df "$work" | awk 'NR==2 {print $1}')."
  echo "Versions: $("$capsule" --version); $(restic version | head -1)"
  echo
  echo "| what | s | MB/s | peak RSS MiB | of dd's speed |"
  echo "|---|---:|---:|---:|---:|"
  for row in "${rows[@]}"; do echo "| ${row//|/ | } |"; done
} | tee "${output:-/dev/null}"
