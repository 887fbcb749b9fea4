#!/usr/bin/env bash
# Forget + prune benchmark: capsule against restic (forget --prune), borg
# (prune + compact) and rustic (forget --prune, when installed), on local
# disk and over SFTP (OpenSSH on loopback) at 2 ms, all in one run. Prints
# a Markdown table.
#
#   bench/prune.sh [--tree DIR] [--snapshots N] [--keep K] [--rtt MS]
#                  [--tools "capsule restic borg rustic"] [--dests "local sftp"]
#                  [--output FILE]
#
# Each tool backs up the same N states of DIR (default: the toolchain's std
# docs, about 120 MB), each state changing about 1% of the files (rewritten,
# added, deleted) from the one before; then keeps the last K (default 10 of
# 50) and gives space back. Ground truth for "reclaimed": the same tool's
# repository holding only the K kept states, made in the same run, so
# reclaimed = (before − after) / (before − that).
# capsule's forget --prune marks and, with nothing else running, deletes in
# the same run; any further prune it takes is timed and counted too.
# Needs root for apt-get (restic, borgbackup).
set -euo pipefail
cd "$(dirname "$0")/.."

tree="" n=50 keep=10 rtt=2 output="" tools="capsule restic borg rustic" dests="local sftp"
while [ $# -gt 0 ]; do
  case "$1" in
    --tree) tree=$2; shift ;;
    --snapshots) n=$2; shift ;;
    --keep) keep=$2; shift ;;
    --rtt) rtt=$2; shift ;;
    --output) output=$2; shift ;;
    --tools) tools=$2; shift ;;
    --dests) dests=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$tree" ] || tree=$(ls -d "$HOME"/.rustup/toolchains/*/share/doc/rust/html/std 2>/dev/null | head -1)
[ -d "$tree" ] || { echo "no tree to use (give --tree DIR)" >&2; exit 2; }

missing=()
for p in restic:restic borg:borgbackup /usr/bin/time:time; do
  command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
rustic=""
for c in "${RUSTIC:-}" "$(command -v rustic || true)" "$HOME/.cache/capsule-bench/bin/rustic"; do
  if [ -n "$c" ] && [ -x "$c" ]; then rustic=$c; break; fi
done

work=$(mktemp -d /tmp/capsule-prunebench.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
use_servers
export CAPSULE_PASSWORD=bench RESTIC_PASSWORD=bench BORG_PASSPHRASE=bench RUSTIC_PASSWORD=bench
export CAPSULE_SFTP_KEY=$CAPSULE_TEST_SFTP_KEY
ssh_opts="-i $CAPSULE_TEST_SFTP_KEY -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
export BORG_RSH="ssh $ssh_opts"
export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
proxies prune "$rtt"
sftp_dir=$CAPSULE_TEST_SFTP_DIR

# The states: DIR, then N−1 rounds of ~1% churn (seeded, the same for
# every tool).
src=$work/src
cp -a "$tree" "$src"
churn() { # ROUND
  python3 - "$src" "$1" <<'EOF'
import os, random, sys
root, rnd = sys.argv[1], random.Random(int(sys.argv[2]))
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
k = max(1, len(files) // 200)
for p in rnd.sample(files, k):            # rewritten
    with open(p, "ab") as f:
        f.write(rnd.randbytes(200))
for p in rnd.sample(files, k):            # deleted
    if os.path.exists(p):
        os.remove(p)
for i in range(k):                        # added
    with open(os.path.join(root, f"new-{sys.argv[2]}-{i}.bin"), "wb") as f:
        f.write(rnd.randbytes(rnd.randint(2000, 60000)))
EOF
}
files=$(find "$src" -type f | wc -l)
bytes=$(du -sb "$src" | cut -f1)

# backup_all TOOL-FUNCTION: N states into the main repository, the last K
# also into the ideal one.
reset_src() { rm -rf "$src"; cp -a "$tree" "$src"; }

size_of() { # local directory or sftp path
  du -sb "$1" | cut -f1
}

rows=()
# run_case DEST TOOL: init, back up N states, forget+prune, measure.
measured() { # LABEL CMD...: prints "wall rss" of CMD
  shift
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >"$work/last.log" 2>&1 || {
    echo "  FAILED: $*" >&2; tail -5 "$work/last.log" >&2; return 1; }
  cat "$work/time"
}

case_tool() { # DEST TOOL MAIN-REPO IDEAL-REPO MAIN-DIR IDEAL-DIR
  local dest=$1 tool=$2 main=$3 ideal=$4 main_dir=$5 ideal_dir=$6
  [[ " $tools " == *" $tool "* ]] || return 0
  [[ " $dests " == *" ${dest%% *} "* ]] || return 0
  echo "== $tool on $dest" >&2
  reset_src
  "${tool}_init" "$main"; "${tool}_init" "$ideal"
  for ((i = 1; i <= n; i++)); do
    [ "$i" -gt 1 ] && churn "$i"
    "${tool}_backup" "$main"
    [ "$i" -gt $((n - keep)) ] && "${tool}_backup" "$ideal"
  done
  local before ideal_size
  before=$(size_of "$main_dir"); ideal_size=$(size_of "$ideal_dir")
  local out wall=0 rss=0 requests="—"
  rm -f "$work/runs"
  out=$("${tool}_prune" "$main") || { rows+=("$dest|$tool|failed|—|—|—|—|—|—|—"); return; }
  # Commands run until the space was back (capsule counts its prunes;
  # restic's is one, borg's two: prune and compact).
  local runs; runs=$(cat "$work/runs" 2>/dev/null || echo "$out" | wc -l)
  # One line per timed command: "wall rss [requests]".
  while read -r w r q; do
    wall=$(python3 -c "print(round($wall + $w, 2))")
    [ "$r" -gt "$rss" ] && rss=$r
    [ -n "${q:-}" ] && requests=$([ "$requests" = "—" ] && echo "$q" || echo $((requests + q)))
  done <<<"$out"
  local after; after=$(size_of "$main_dir")
  local pct; pct=$(python3 -c "b,a,i=$before,$after,$ideal_size; print(f'{100*(b-a)/max(b-i,1):.0f}%')")
  rows+=("$dest|$tool|$wall|$runs|$((rss / 1024))|$requests|$((before / 1000000))|$((after / 1000000))|$((ideal_size / 1000000))|$pct")
  echo "  $tool $dest: $wall s, $((rss / 1024)) MiB, reclaimed $pct (before $before, after $after, ideal $ideal_size)" >&2
}

# capsule keeps its cache, as restic does (borg keeps its chunk index):
# the prune then reads index files and tree packs from local disk.
export CAPSULE_CACHE_DIR=$work/capsule-cache
capsule_init() { "$capsule" -r "$1" -q init; }
capsule_backup() { "$capsule" -r "$1" -q backup "$src" >/dev/null; }
# One `forget --prune` gives the space back when nothing else runs (it
# sweeps its own marks); further prunes are run, and counted, only while
# one still finds something to mark or delete (at most three).
capsule_prune() {
  local t runs=1 changed
  t=$(measured forget "$capsule" -r "$1" --json forget --keep-last "$keep" --prune) || return 1
  echo "$t $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["destination"]["requests"])' "$work/last.log")"
  for _ in 1 2 3; do
    changed=$(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["prune"]; print(int(p["marks_waiting"] > 0 or p["packs_marked"] > p["packs_deleted"]))' "$work/last.log")
    [ "$changed" = 1 ] || break
    t=$(measured prune "$capsule" -r "$1" --json prune) || return 1
    echo "$t $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["destination"]["requests"])' "$work/last.log")"
    runs=$((runs + 1))
  done
  echo "$runs" >"$work/runs"
}
restic_opts=()
restic_init() { restic "${restic_opts[@]}" -r "$1" init -q >/dev/null; }
restic_backup() { restic "${restic_opts[@]}" -r "$1" backup -q "$src" >/dev/null; }
restic_prune() { measured restic restic "${restic_opts[@]}" -r "$1" forget -q --keep-last "$keep" --prune; }
borg_init() { borg init -e repokey "$1" >/dev/null 2>&1; }
borg_backup() { borg create "$1::s{now:%s%f}" "$src" >/dev/null 2>&1; }
borg_prune() {
  measured borg borg prune --keep-last "$keep" "$1" || return 1
  measured borg borg compact "$1"
}
rustic_init() { "$rustic" -r "$1" init >/dev/null 2>&1; }
rustic_backup() { "$rustic" -r "$1" backup "$src" >/dev/null 2>&1; }
# rustic keeps packs it marks for 23 h by default, as capsule's first prune
# does; capsule's second prune deletes them (both timed), so rustic deletes
# at once to reach the same end state.
rustic_prune() { measured rustic "$rustic" -r "$1" forget --keep-last "$keep" --prune --instant-delete; }

# Local disk.
l=$work/local
case_tool local capsule "$l/capsule" "$l/capsule-ideal" "$l/capsule" "$l/capsule-ideal"
case_tool local restic "$l/restic" "$l/restic-ideal" "$l/restic" "$l/restic-ideal"
case_tool local borg "$l/borg" "$l/borg-ideal" "$l/borg" "$l/borg-ideal"
[ -n "$rustic" ] && case_tool local rustic "$l/rustic" "$l/rustic-ideal" "$l/rustic" "$l/rustic-ideal"

# SFTP through the proxy.
tag=${work##*.}
su="root@${sftp%:*}"
p="${sftp#*:}"
case_tool "sftp ${rtt} ms" capsule "sftp://$su:$p$sftp_dir/pb-$tag-c" "sftp://$su:$p$sftp_dir/pb-$tag-ci" \
  "$sftp_dir/pb-$tag-c" "$sftp_dir/pb-$tag-ci"
restic_opts=(-o "sftp.command=ssh $ssh_opts -p $p $su -s sftp")
case_tool "sftp ${rtt} ms" restic "sftp:$su:$sftp_dir/pb-$tag-r" "sftp:$su:$sftp_dir/pb-$tag-ri" \
  "$sftp_dir/pb-$tag-r" "$sftp_dir/pb-$tag-ri"
case_tool "sftp ${rtt} ms" borg "ssh://$su:$p$sftp_dir/pb-$tag-b" "ssh://$su:$p$sftp_dir/pb-$tag-bi" \
  "$sftp_dir/pb-$tag-b" "$sftp_dir/pb-$tag-bi"
rm -rf "$sftp_dir"/pb-"$tag"-*

{
  echo "### forget + prune: $n snapshots of $(basename "$tree") ($files files, $((bytes / 1000000)) MB, ~1% churn each), keep the last $keep"
  echo
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); capsule $("$capsule" --version | cut -d' ' -f2), $(restic version | cut -d' ' -f1-2), $(borg --version)${rustic:+, $("$rustic" --version)}. \`bench/prune.sh\`, $(date -u +%Y-%m-%d)."
  echo
  echo "| destination | tool | forget+prune wall (s) | runs to reclaim | peak RSS (MiB) | requests | repo before (MB) | after (MB) | only the kept (MB) | reclaimed |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
  echo
  echo "capsule's wall time is its \`forget --prune\` (which deletes what it marks when nothing else runs) and any further prune it took; restic's is \`forget --prune\`; borg's \`prune\` + \`compact\`. Reclaimed = (before − after) / (before − a repository of only the kept states, made by the same tool in the same run)."
} | tee "${output:-/dev/stdout}"
