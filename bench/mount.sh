#!/usr/bin/env bash
# Looking into snapshots through `capsule mount` (issue "Go back in time"),
# against restic 0.14's mount of the same data, in the same run, from local
# repositories on a journaled scratch disk:
#   * listing a directory of 100,000 files (`ls -f`: names only, and
#     `ls -l`: every entry's attributes too), on a fresh mount (cold) and
#     again (warm);
#   * `cp -r` of a real tree (--tree, default /usr/share/doc) out of the
#     mount, against `capsule restore` of the same tree into a new
#     directory (and restic's mount and restore);
#   * `cat` of a 1 GiB file out of the mount, against restoring it;
#   * cp's own floor: the same `cp -r` from the source tree on disk; and
#     the floor of any FUSE file system: the same `cp -r` through bindfs,
#     a FUSE passthrough of the source tree (no decryption, no repository).
# Each a median of --runs, wall seconds, with the page cache dropped before
# each cold run (root only). Copies and restores are written to the
# journaled scratch disk too (bench/lib.sh says why: written to this
# machine's root, ext4 without a journal, each just after the last was
# deleted, `cp -r` out of the mount took 1.9-2.2 s, against 1.16 s here).
#
#   bench/mount.sh [--tree /usr/share/doc] [--runs 3] [--output FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
tree=/usr/share/doc runs=3 output=""
while [ $# -gt 0 ]; do
  case $1 in
    --tree) tree=$2; shift ;;
    --runs) runs=$2; shift ;;
    --output) output=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -e /dev/fuse ] || { echo "no /dev/fuse: nothing to measure" >&2; exit 1; }
for t in restic bindfs; do
  command -v $t >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $t >/dev/null; }
done
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /tmp/capsule-mountbench.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
mounted=() pids=()
cleanup() {
  local m p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
  scratch_release
  rm -rf "$work"
}
trap cleanup EXIT
scratch_disk "$work/disk" 16
disk=$work/disk
export CAPSULE_PASSWORD=bench RESTIC_PASSWORD=bench CAPSULE_CACHE_DIR=$work/cache CAPSULE_STATE_DIR=$work/state
unset CAPSULE_REPO CAPSULE_PROFILE

drop() { sync; [ "$(id -u)" = 0 ] && echo 3 >/proc/sys/vm/drop_caches || true; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
timed() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); python3 -c "print(round($t1 - $t0, 3))"; }

# The data: 100,000 files in one directory, the tree, one 1 GiB file.
src=$disk/src
mkdir -p "$src/flat" "$src/big"
python3 - "$src/flat" <<'PY'
import os, sys
for i in range(100_000):
    with open(os.path.join(sys.argv[1], "f%06d" % i), "w") as f:
        f.write("file %d\n" % i)
PY
cp -a "$tree" "$src/tree"
head -c $((1 << 30)) /dev/urandom >"$src/big/one-gib"
files=$(find "$src/tree" -type f | wc -l)
bytes=$(du -sb "$src/tree" | cut -f1)

"$capsule" --repo "$disk/capsule" init -q
"$capsule" --repo "$disk/capsule" backup -q "$src"
restic -q init -r "$disk/restic" >/dev/null
restic -q -r "$disk/restic" backup "$src" >/dev/null

# mount_capsule DIR / mount_restic DIR: mounted, ready (bounded: 60 s).
wait_for() { local i; for i in $(seq 600); do [ -e "$1" ] && return 0; sleep 0.1; done; echo "not up: $1" >&2; exit 1; }
mount_capsule() { mkdir -p "$1"; "$capsule" --repo "$disk/capsule" mount "$1" >/dev/null 2>&1 & pids+=($!); mounted+=("$1"); wait_for "$1/latest/"; }
mount_restic() { mkdir -p "$1"; restic -q -r "$disk/restic" mount "$1" >/dev/null 2>&1 & pids+=($!); mounted+=("$1"); wait_for "$1/snapshots/latest/"; }
unmount_all() {
  local p m
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
  pids=() mounted=()
}

declare -A r
measure() { # TOOL MOUNTFN INSIDE (path of the source inside the mount)
  local tool=$1 fn=$2 inside=$3 m=$work/m-$1 k
  local lf=() lfw=() ll=() llw=() cp=() cat=()
  for k in $(seq "$runs"); do
    drop; $fn "$m"
    lf+=("$(timed ls -f "$m/$inside/flat")"); lfw+=("$(timed ls -f "$m/$inside/flat")")
    ll+=("$(timed ls -l "$m/$inside/flat")"); llw+=("$(timed ls -l "$m/$inside/flat")")
    unmount_all; drop; $fn "$m"
    rm -rf "$disk/cp"; cp+=("$(timed cp -r "$m/$inside/tree" "$disk/cp")")
    drop; cat+=("$(timed cat "$m/$inside/big/one-gib")")
    unmount_all
  done
  r[$tool,lf]=$(median "${lf[@]}") r[$tool,lfw]=$(median "${lfw[@]}")
  r[$tool,ll]=$(median "${ll[@]}") r[$tool,llw]=$(median "${llw[@]}")
  r[$tool,cp]=$(median "${cp[@]}") r[$tool,cat]=$(median "${cat[@]}")
}
inside=latest${src}
measure capsule mount_capsule "$inside"
measure restic mount_restic "snapshots/latest${src}"

# Restores of the same tree and file, each into a new directory.
# And cp's own floor: the same `cp -r` from the source tree on the same
# disk, no FUSE in between.
rt=() rb=() qt=() qb=() fl=() bf=()
mkdir -p "$work/bindfs"
for k in $(seq "$runs"); do
  rm -rf "$disk/cp"; drop
  fl+=("$(timed cp -r "$src/tree" "$disk/cp")")
  rm -rf "$disk/cp"; bindfs -r "$src" "$work/bindfs"; mounted+=("$work/bindfs"); drop
  bf+=("$(timed cp -r "$work/bindfs/tree" "$disk/cp")")
  umount "$work/bindfs"; mounted=()
  rm -rf "$disk/rs"; drop
  rt+=("$(timed "$capsule" --repo "$disk/capsule" restore latest -q --target "$disk/rs" --include "$src/tree")")
  rm -rf "$disk/rs"; drop
  rb+=("$(timed "$capsule" --repo "$disk/capsule" restore latest -q --target "$disk/rs" --include "$src/big")")
  rm -rf "$disk/rs"; drop
  qt+=("$(timed restic -q -r "$disk/restic" restore latest --target "$disk/rs" --include "$src/tree")")
  rm -rf "$disk/rs"; drop
  qb+=("$(timed restic -q -r "$disk/restic" restore latest --target "$disk/rs" --include "$src/big")")
done
rm -rf "$disk/rs" "$disk/cp"

table=$({
  echo "Machine: $(nproc) cores, $(free -g | awk '/Mem/ {print $2}') GiB; $("$capsule" --version); $(restic version | cut -d' ' -f1-2)."
  echo "Command: bench/mount.sh --tree $tree --runs $runs ($(date -u +%F)); local repositories on a journaled scratch disk; medians of $runs; page cache dropped before each cold run and each restore."
  echo
  echo "| | capsule mount | restic mount | ratio |"
  echo "|---|---:|---:|---:|"
  row() { echo "| $1 | $2 s | $3 s | $(python3 -c "print(f'{$3 / max($2, 1e-3):.1f}x')") |"; }
  row "\`ls -f\` of 100,000 files, cold" "${r[capsule,lf]}" "${r[restic,lf]}"
  row "\`ls -f\` of 100,000 files, warm" "${r[capsule,lfw]}" "${r[restic,lfw]}"
  row "\`ls -l\` of 100,000 files, cold" "${r[capsule,ll]}" "${r[restic,ll]}"
  row "\`ls -l\` of 100,000 files, warm" "${r[capsule,llw]}" "${r[restic,llw]}"
  row "\`cp -r\` of $tree ($files files, $((bytes >> 20)) MiB)" "${r[capsule,cp]}" "${r[restic,cp]}"
  row "\`cat\` of a 1 GiB file" "${r[capsule,cat]}" "${r[restic,cat]}"
  row "restore of $tree" "$(median "${rt[@]}")" "$(median "${qt[@]}")"
  row "restore of the 1 GiB file" "$(median "${rb[@]}")" "$(median "${qb[@]}")"
  echo
  echo "Floors for \`cp -r\` of the same tree, cold: from the source on the same disk, no FUSE, $(median "${fl[@]}") s;"
  echo "through bindfs $(bindfs --version 2>/dev/null | head -1 | cut -d' ' -f2), a FUSE passthrough of the source (no repository, no decryption), $(median "${bf[@]}") s."
})
echo "$table"
if [ -n "$output" ]; then echo "$table" >"$output"; fi
