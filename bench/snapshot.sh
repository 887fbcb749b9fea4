#!/usr/bin/env bash
# Source snapshots (issue 46): what the snapshot step costs, on a btrfs file
# system on a loop device (an image under /var/tmp), in the same run:
#   * `btrfs subvolume snapshot -r` and `delete` of the source subvolume
#     alone, and the snapshot step as capsule's runs record it;
#   * the Rust toolchain tree (rustup's stable, copied in): the first backup
#     and a no-change full scan (--no-journal), from live files and from a
#     snapshot, alternating, each into its own local repository;
#   * a tree of --files small files (in the top-level subvolume, which
#     the daemon's fanotify can watch) under the daemon's change journal, with
#     source-snapshot = "btrfs": a no-change run (nothing to read, so no
#     snapshot is taken) and a run after 100 files changed (a snapshot is
#     taken, and only the changed directories are read), each against the
#     same runs with source-snapshot = "off".
# Medians of --runs; capsule's seconds as each run records them (start to
# snapshot stored). Needs root (loop device, btrfs).
# --cold drops the page cache before each toolchain run (a snapshot's files
# are new inodes: they never share the original's cached pages, so warm
# runs compare a cached tree with an uncached one); --no-journal-part skips
# the daemon's runs.
#
#   bench/snapshot.sh [--files 120000] [--runs 5] [--cold] [--no-journal-part] [--output FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
files=120000 runs=5 output="" cold="" journal_part=1
while [ $# -gt 0 ]; do
  case $1 in
    --files) files=$2; shift ;;
    --runs) runs=$2; shift ;;
    --output) output=$2; shift ;;
    --cold) cold=1 ;;
    --no-journal-part) journal_part="" ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "bench/snapshot.sh needs root (a loop device)" >&2; exit 2; }
command -v mkfs.btrfs >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq btrfs-progs >/dev/null; }
toolchain=$(rustc --print sysroot)
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /var/tmp/capsule-snapbench.XXXXXX)
mnt=$work/mnt daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  umount "$mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
unset CAPSULE_PASSWORD CAPSULE_REPO CAPSULE_PROFILE CAPSULE_SOURCE_SNAPSHOT
export CAPSULE_PASSWORD_FILE=$work/pw
echo bench >"$work/pw"

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ms() { python3 -c "print(round(($2 - $1) * 1000, 1))"; }
field() { python3 -c "import json,sys; v=json.load(open(sys.argv[1])); print($2)" "$1"; }

truncate -s 8G "$work/img"
mkfs.btrfs -q -f "$work/img"
mkdir -p "$mnt"
mount -o loop "$work/img" "$mnt"
btrfs -q subvolume create "$mnt/rust"
# A directory of the top-level subvolume: the daemon's fanotify cannot mark
# a subvolume of its own (EXDEV), and without it the journal scans in full.
mkdir -p "$mnt/small"
echo "copying $toolchain..." >&2
cp -a "$toolchain/." "$mnt/rust/"
# shellcheck source=bench/lib.sh
source bench/lib.sh
if [ -n "$journal_part" ]; then
  echo "making $files files..." >&2
  make_tree "$mnt/small" "$files"
fi
sync
rust_files=$(find "$mnt/rust" -type f | wc -l)
rust_bytes=$(du -sb "$mnt/rust" | cut -f1)

# The snapshot step alone.
make=() drop=()
for ((i = 0; i < runs; i++)); do
  t0=$EPOCHREALTIME; btrfs -q subvolume snapshot -r "$mnt/rust" "$mnt/s$i"; t1=$EPOCHREALTIME
  btrfs -q subvolume delete "$mnt/s$i"; t2=$EPOCHREALTIME
  make+=("$(ms "$t0" "$t1")"); drop+=("$(ms "$t1" "$t2")")
done

# The toolchain tree: first backup and no-change full scans, live and
# from a snapshot, alternating.
drop() { if [ -n "$cold" ]; then sync; echo 3 >/proc/sys/vm/drop_caches; fi; }
for m in off btrfs; do "$capsule" -q -r "$work/repo-$m" init; done
declare -A first full step
for m in off btrfs; do
  drop
  "$capsule" -r "$work/repo-$m" --json backup --no-journal --source-snapshot $m "$mnt/rust" >"$work/first-$m.json"
  first[$m]=$(field "$work/first-$m.json" 'round(v["duration_secs"], 3)')
done
for ((i = 0; i < runs; i++)); do
  for m in off btrfs; do
    drop
    "$capsule" -r "$work/repo-$m" --json backup --no-journal --source-snapshot $m "$mnt/rust" >"$work/full.json"
    full[$m]+="$(field "$work/full.json" 'round(v["duration_secs"], 3)') "
    step[$m]+="$(field "$work/full.json" 'v["snapshot_secs"]') "
  done
done
# shellcheck disable=SC2086
rust_off=$(median ${full[off]}) rust_snap=$(median ${full[btrfs]}) snap_step=$(median ${step[btrfs]})

# The small tree under the daemon's journal.
status_field() { "$capsule" --json status | python3 -c "import json,sys; r=json.load(sys.stdin)['profiles'][0]['last_run']; print($1)"; }
declare -A quiet changed
for m in ${journal_part:+off btrfs}; do
  w=$work/journal-$m
  mkdir -p "$w"
  cat >"$w/capsule.toml" <<TOML
[profiles.p]
sources = ["$mnt/small"]
repository = "$w/repo"
password-command = "echo bench"
schedule = { backup = "hourly" }
journal-verify-every = 0
source-snapshot = "$m"
TOML
  export CAPSULE_CONFIG=$w/capsule.toml CAPSULE_STATE_DIR=$w/state CAPSULE_CACHE_DIR=$w/cache
  clock=$w/clock now=$(date +%s)
  echo "$now" >"$clock"
  export CAPSULE_TEST_NOW=@$clock
  "$capsule" -q --profile p init
  "$capsule" -q --profile p backup
  "$capsule" daemon 2>"$w/daemon.log" &
  daemon=$!
  for _ in $(seq 1200); do grep -q watching "$w/daemon.log" && break; sleep 0.1; done
  run_by_daemon
  for ((i = 0; i < runs; i++)); do
    run_by_daemon
    quiet[$m]+="$(status_field 'round(r["duration_secs"], 4)') "
    [ "$(status_field 'r["scan"]["mode"]')" = journal ] || { echo "no-change run $i ($m) did not follow the journal" >&2; exit 1; }
  done
  for ((i = 0; i < runs; i++)); do
    python3 - "$mnt/small" "$i$m" <<'PY'
import os, sys
root, k = sys.argv[1], sys.argv[2]
dirs = sorted(os.path.join(a, b) for a in os.listdir(root) if not a.startswith(".") for b in os.listdir(os.path.join(root, a)))
step = max(1, len(dirs) // 100)
for d in dirs[::step][:100]:
    with open(os.path.join(root, d, "f00"), "a") as f:
        f.write("changed %s\n" % k)
PY
    run_by_daemon
    changed[$m]+="$(status_field 'round(r["duration_secs"], 4)') "
    [ "$(status_field 'r["scan"]["mode"]')" = journal ] || { echo "changed run $i ($m) did not follow the journal" >&2; exit 1; }
  done
  kill "$daemon"; wait "$daemon" 2>/dev/null || true; daemon=""
  left=$( (find "$mnt/.capsule-snapshots" -mindepth 1 -maxdepth 1 2>/dev/null || true) | wc -l)
  [ "$left" = 0 ] || { echo "$left snapshots left behind" >&2; exit 1; }
done

ratio() { python3 -c "print(round($2 / $1, 2))"; }
{
  echo "### Source snapshots (\`bench/snapshot.sh --files $files --runs $runs${cold:+ --cold}$([ -n "$journal_part" ] || echo " --no-journal-part")\`, $(date -u +%Y-%m-%d))"
  echo
  echo "$(nproc) cores; capsule $("$capsule" --version | cut -d' ' -f2); $(btrfs --version | head -1); btrfs on a loop device (an 8 GiB image on this machine's disk); local repositories on the same disk. Medians of $runs; capsule's seconds as each run records them (start to snapshot stored)."
  echo
  echo "| step | live files | from a snapshot | ratio |"
  echo "|---|---:|---:|---:|"
  # shellcheck disable=SC2086
  echo "| \`btrfs subvolume snapshot -r\`, \`delete\` (Rust toolchain subvolume) | — | $(median "${make[@]}") ms, $(median "${drop[@]}") ms | — |"
  echo "| snapshot step as the run records it (take, remove) | — | $(python3 -c "print(round($snap_step * 1000, 1))") ms | — |"
  echo "| Rust toolchain ($rust_files files, $((rust_bytes >> 20)) MiB): first backup, s | ${first[off]} | ${first[btrfs]} | $(ratio "${first[off]}" "${first[btrfs]}") |"
  echo "| Rust toolchain: no-change full scan (--no-journal), s | $rust_off | $rust_snap | $(ratio "$rust_off" "$rust_snap") |"
  if [ -n "$journal_part" ]; then
  # shellcheck disable=SC2086
  echo "| $files small files, daemon + journal: no change (no snapshot taken), s | $(median ${quiet[off]}) | $(median ${quiet[btrfs]}) | $(ratio "$(median ${quiet[off]})" "$(median ${quiet[btrfs]})") |"
  # shellcheck disable=SC2086
  echo "| $files small files, daemon + journal: 100 changed, s | $(median ${changed[off]}) | $(median ${changed[btrfs]}) | $(ratio "$(median ${changed[off]})" "$(median ${changed[btrfs]})") |"
  fi
  echo
  echo "Runs: toolchain full scans off ${full[off]}/ btrfs ${full[btrfs]}${journal_part:+; journal no-change off ${quiet[off]}/ btrfs ${quiet[btrfs]}; 100 changed off ${changed[off]}/ btrfs ${changed[btrfs]}}."
} | tee "${output:-/dev/stderr}"
