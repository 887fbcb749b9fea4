#!/usr/bin/env bash
# Memory and start-up against the repository's size: the same operations on
# a repository of 100,000 blobs and one of 10,000,000, same run, local disk.
# Prints a Markdown table: wall seconds, peak RSS and (for backups) the
# seconds until the run is ready to scan ("ready": repository opened, index
# and parent loaded).
#
#   bench/index.sh [--blobs "100000 10000000"] [--tiny N] [--output FILE] [--keep-repos DIR]
#
# The repositories are made by bench/src/bin/blobgen.rs, which writes real
# small blobs (64-447 bytes, incompressible) through the engine's packer, a
# file each, 1,000 files a directory, in 10 snapshots of a tenth each.
# Operations, in order, each timed by /usr/bin/time:
#   first run here   a backup of one file, with no local index tables: it
#                    builds them from the index files (once per machine)
#   backup +10,000   a backup adding 10,000 new files (4 KiB each)
#   no-change run    the same source again (no journal)
#   restore 1 file   one file of a generated snapshot
#   restore all      everything of the 10,000-file snapshot
#   check            structure (not --read-data)
#   check --read-data  every pack read and every blob checked
#   mount            the mount process's peak RSS (VmHWM) after listing
#                    the snapshots, a directory of 1,000 files of a
#                    generated snapshot, and reading one file
#   page             the page's server's peak RSS after the snapshot list,
#                    a directory of 1,000 files, one file and its versions
#   forget + prune   forget one generated snapshot (a tenth of the blobs),
#                    then prune
#   daemon           the daemon process's peak RSS (VmHWM) while it
#                    schedules runs of a profile backing up the 10,000
#                    files, the first building the index tables (each run
#                    is a child process, whose peak the rows above give)
# Then, with --tiny N (default 1,000,000; 0 skips), a tree of N tiny files
# (100 a directory, as bench/journal.sh makes): capsule's initial backup and
# a no-change run (by hand: no journal), and restic's, same tree, same run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh

sizes="100000 10000000" output="" keep="" tiny=1000000
while [ $# -gt 0 ]; do
  case "$1" in
    --blobs) sizes=$2; shift ;;
    --output) output=$2; shift ;;
    --keep-repos) keep=$2; shift ;;
    --tiny) tiny=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

cargo build --release -q -p capsule -p capsule-bench
capsule=$PWD/target/release/capsule
blobgen=$PWD/target/release/blobgen
work=${keep:-$(mktemp -d /var/tmp/capsule-index.XXXXXX)}
mkdir -p "$work"
# A mount left up by a failure is taken down before anything is removed.
trap 'fusermount -u "$work/mnt" 2>/dev/null || true; [ -n "$keep" ] || rm -rf "$work"' EXIT
export CAPSULE_PASSWORD=bench-index CAPSULE_CACHE_DIR=$work/cache RUST_BACKTRACE=0

# A source of 10,000 new files of 4 KiB each.
src=$work/src10k
if [ ! -d "$src" ]; then
  mkdir -p "$src"
  python3 - "$src" <<'PY'
import os, sys
root = sys.argv[1]
for d in range(10):
    os.makedirs(f"{root}/d{d}", exist_ok=True)
    for f in range(1000):
        with open(f"{root}/d{d}/f{f}", "wb") as fh:
            fh.write(os.urandom(4096))
PY
fi
mkdir -p "$work/one" && echo one >"$work/one/file"

# timed LABEL CMD...: appends "LABEL|seconds|peak MiB|ready" to $rows_file
timed() {
  local label=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$work/rss" "$@" >"$work/out.json" 2>"$work/err" || {
    echo "failed: $label: $*" >&2; tail -5 "$work/err" >&2; exit 1; }
  t1=$(date +%s.%N)
  local ready
  ready=$(python3 -c 'import json,sys
try:
    print(round(json.load(open(sys.argv[1]))["stages"]["ready"], 3))
except Exception:
    print("—")' "$work/out.json")
  echo "$label|$(python3 -c "print(round($t1 - $t0, 2))")|$(( $(cat "$work/rss") / 1024 ))|$ready" >>"$rows_file"
}

# mount_peak REPO TIME: the mount process's peak RSS (MiB) after it lists
# the snapshots and directory d000001 of the snapshot taken at TIME (1,000
# files), and reads one.
mount_peak() {
  local at=$work/mnt
  mkdir -p "$at"
  "$capsule" -r "$1" mount "$at" >/dev/null 2>"$work/mount.log" &
  local pid=$!
  for _ in $(seq 600); do [ -d "$at/snapshots" ] && break; sleep 0.1; done
  [ -d "$at/snapshots" ] || { echo "the mount did not come up" >&2; cat "$work/mount.log" >&2; kill "$pid"; exit 1; }
  # No `find`: it would look up every entry of the snapshot, and the
  # mount keeps what the kernel keeps (see bench/RESULTS.md).
  ls "$at/snapshots" >/dev/null
  local dir=$at/snapshots/$2
  [ "$(ls "$dir/d000001" | wc -l)" = 1000 ] || { echo "the mount shows $(ls "$dir/d000001" | wc -l) files in d000001" >&2; exit 1; }
  cat "$dir/d000001/$(ls "$dir/d000001" | head -1)" >/dev/null
  awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  fusermount -u "$at" 2>/dev/null || true
}

# mount_find LABEL CMD...: mounts with CMD at $work/mnt, runs `find` and
# then `ls -lR` over its first snapshot, and appends "LABEL|find s, ls -lR
# s|the mount process's peak RSS (MiB)|entries" to $rows_file. The kernel
# keeps an inode for every entry it passed, and so does the mount: this is
# the mount's memory at the snapshot's size.
mount_find() {
  local label=$1; shift
  local at=$work/mnt
  mkdir -p "$at"
  "$@" "$at" >/dev/null 2>"$work/mount.log" &
  local pid=$!
  for _ in $(seq 600); do [ -d "$at/snapshots" ] && [ -n "$(ls "$at/snapshots" 2>/dev/null)" ] && break; sleep 0.1; done
  local snap
  snap=$(ls "$at/snapshots" 2>/dev/null | head -1)
  [ -n "$snap" ] || { echo "the mount did not come up" >&2; cat "$work/mount.log" >&2; kill "$pid"; exit 1; }
  local t0 t1 t2 n
  t0=$(date +%s.%N)
  n=$(timeout 1200 find "$at/snapshots/$snap" | wc -l)
  t1=$(date +%s.%N)
  timeout 1200 ls -lR "$at/snapshots/$snap" >/dev/null
  t2=$(date +%s.%N)
  local peak
  peak=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  fusermount -u "$at" 2>/dev/null || umount -l "$at" 2>/dev/null || true
  echo "$label|$(python3 -c "print(round($t1 - $t0, 1), round($t2 - $t1, 1), sep=', ')")|$peak|$n" >>"$rows_file"
}

# page_peak REPO SNAP: the page's server's peak RSS (MiB) after the
# snapshot list, directory d000001 of SNAP, one file, and its versions.
page_peak() {
  "$capsule" -r "$1" --json ui --no-browser >"$work/ui.json" 2>"$work/ui.log" &
  local pid=$!
  local url="" token base
  for _ in $(seq 600); do
    url=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["url"])' "$work/ui.json" 2>/dev/null) && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "the page did not come up" >&2; cat "$work/ui.log" >&2; kill "$pid"; exit 1; }
  token=${url##*t=}; base=${url%%\?*}; base=${base%/}
  get() { curl -fsS -H "x-capsule-token: $token" "$base$1"; }
  get "/api/snapshots" >/dev/null
  local n
  n=$(get "/api/ls?snapshot=$2&path=/d000001" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(len(d["entries"]) if isinstance(d, dict) else len(d))')
  [ "$n" = 1000 ] || { echo "the page lists $n entries in d000001" >&2; kill "$pid"; exit 1; }
  local f
  f=$(get "/api/ls?snapshot=$2&path=/d000001" | python3 -c 'import json,sys; d=json.load(sys.stdin); e=d["entries"] if isinstance(d, dict) else d; print(e[0]["name"])')
  get "/api/file?snapshot=$2&path=/d000001/$f" >/dev/null
  get "/api/versions?path=/d000001/$f" >/dev/null
  awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status"
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

# daemon_peak REPO: the daemon's peak RSS (MiB) over two scheduled runs of
# a profile backing up $src into REPO, the first with no index tables here.
daemon_peak() {
  local d=$work/daemon
  rm -rf "$d"; mkdir -p "$d"
  cat >"$d/capsule.toml" <<TOML
[profiles.p]
sources = ["$src"]
repository = "$1"
password-command = "echo $CAPSULE_PASSWORD"
schedule = { backup = "hourly" }
TOML
  rm -rf "$CAPSULE_CACHE_DIR"/*/index-tables
  (
    export CAPSULE_CONFIG=$d/capsule.toml CAPSULE_STATE_DIR=$d/state
    unset CAPSULE_PASSWORD
    local now; now=$(date +%s)
    echo "$now" >"$d/clock"
    export CAPSULE_TEST_NOW=@$d/clock
    last_start() { "$capsule" --json status | python3 -c 'import json,sys; r=json.load(sys.stdin)["profiles"][0]["last_success"]; print(r["started_unix"] if r else 0)'; }
    "$capsule" daemon 2>"$d/log" &
    local pid=$!
    for _ in 1 2; do
      now=$((now + 3600)); echo "$now" >"$d/clock"
      for _ in $(seq 1200); do [ "$(last_start)" = "$now" ] && break; sleep 0.1; done
      [ "$(last_start)" = "$now" ] || { echo "the daemon made no run at $now" >&2; tail "$d/log" >&2; kill "$pid"; exit 1; }
    done
    awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status"
    kill "$pid"; wait "$pid" 2>/dev/null || true
  )
}

declare -A results
for n in $sizes; do
  repo=$work/repo-$n
  rows_file=$work/rows-$n
  : >"$rows_file"
  if [ ! -f "$repo/config" ]; then
    "$capsule" -r "$repo" init >/dev/null
    t0=$(date +%s.%N)
    "$blobgen" "$repo" "$n" 10
    echo "generated $n blobs in $(python3 -c "print(round($(date +%s.%N) - $t0))") s" >&2
  fi
  rm -rf "$CAPSULE_CACHE_DIR"
  timed "first run here (builds the tables)" "$capsule" -r "$repo" --json backup "$work/one"
  timed "backup adding 10,000 files" "$capsule" -r "$repo" --json backup "$src"
  timed "no-change run, no journal" "$capsule" -r "$repo" --json backup "$src"
  read -r snap snap_time < <("$capsule" -r "$repo" --json snapshots | python3 -c 'import json,sys
s=[x for x in json.load(sys.stdin) if x["snapshot"].get("hostname")=="blobgen"]
print(s[3]["id"], s[3]["snapshot"]["time"])')
  rm -rf "$work/target"
  timed "restore 1 file" "$capsule" -r "$repo" --json restore "$snap" --target "$work/target" \
    --include '/d000001/f*500'
  rm -rf "$work/target-all"
  timed "restore all (the 10,000-file snapshot)" "$capsule" -r "$repo" --json restore latest --target "$work/target-all"
  timed "check" "$capsule" -r "$repo" --json check
  timed "check --read-data" "$capsule" -r "$repo" --json check --read-data
  if [ -e /dev/fuse ]; then
    # A helper's `exit 1` ends only its $(...): `|| exit 1` ends the run.
    peak=$(mount_peak "$repo" "$snap_time") || exit 1
    echo "mount: list, read one file (peak RSS)|—|$peak|—" >>"$rows_file"
  fi
  peak=$(page_peak "$repo" "$snap") || exit 1
  echo "page: list, one file, its versions (peak RSS)|—|$peak|—" >>"$rows_file"
  "$capsule" -r "$repo" forget "$snap" >/dev/null
  timed "prune after forgetting a tenth" "$capsule" -r "$repo" --json prune
  peak=$(daemon_peak "$repo") || exit 1
  echo "daemon process while it runs the profile (peak RSS)|—|$peak|—" >>"$rows_file"
  results[$n]=$rows_file
  echo "done: $n blobs" >&2
done

# The tree of tiny files: capsule and restic, initial and no-change.
tiny_rows=()
if [ "$tiny" -gt 0 ]; then
  command -v restic >/dev/null || apt-get install -y -qq restic >/dev/null 2>&1 || true
  tree=$work/tiny-$tiny
  if [ ! -d "$tree" ]; then
    make_tree "$tree" "$tiny"
  fi
  rows_file=$work/rows-tiny
  : >"$rows_file"
  # Warm: every tool reads the tree from the page cache, the first too.
  # (through a pipe: GNU tar writing to /dev/null reads no file contents)
  tar cf - -C "$tree" . | cat >/dev/null
  rm -rf "$work/tiny-repo" "$CAPSULE_CACHE_DIR"
  "$capsule" -r "$work/tiny-repo" init >/dev/null
  timed "capsule initial backup" "$capsule" -r "$work/tiny-repo" --json backup "$tree"
  timed "capsule no-change run, no journal" "$capsule" -r "$work/tiny-repo" --json backup "$tree"
  mount_find "capsule mount: find, then ls -lR, over the snapshot (s; the mount's peak)" "$capsule" -r "$work/tiny-repo" mount
  if command -v restic >/dev/null; then
    export RESTIC_PASSWORD=bench-index RESTIC_REPOSITORY=$work/tiny-restic RESTIC_CACHE_DIR=$work/restic-cache
    rm -rf "$RESTIC_REPOSITORY" "$RESTIC_CACHE_DIR"
    restic init -q >/dev/null
    timed "$(restic version | cut -d' ' -f1,2) initial backup" restic backup -q "$tree"
    timed "$(restic version | cut -d' ' -f1,2) no-change run" restic backup -q "$tree"
    mount_find "$(restic version | cut -d' ' -f1,2) mount: find, then ls -lR (s; the mount's peak)" restic mount
  fi
  while IFS='|' read -r label s m _; do tiny_rows+=("| $label | $s | $m |"); done <"$rows_file"
fi

{
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); capsule $("$capsule" --version | cut -d' ' -f2); $(date -u +%F)"
  echo "Command: bench/index.sh --blobs \"$sizes\""
  echo
  if [ -n "$sizes" ]; then
  header="| operation |"; sep="|---|"
  for n in $sizes; do header+=" $n blobs: s, peak MiB, ready s |"; sep+="---|"; done
  echo "$header"; echo "$sep"
  first=${sizes%% *}
  while IFS='|' read -r label _ _ _; do
    line="| $label |"
    for n in $sizes; do
      r=$(grep -F "$label|" "${results[$n]}" | head -1 | cut -d'|' -f2-)
      IFS='|' read -r s m rd <<<"$r"
      line+=" $s, $m, $rd |"
    done
    echo "$line"
  done <"${results[$first]}"
  fi
  if [ ${#tiny_rows[@]} -gt 0 ]; then
    echo
    echo "$tiny tiny files (100 a directory), same run:"
    echo
    echo "| run | s | peak RSS MiB |"
    echo "|---|---|---|"
    printf '%s\n' "${tiny_rows[@]}"
  fi
} | tee "${output:-/dev/null}"
