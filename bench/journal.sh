#!/usr/bin/env bash
# The change journal (issue "Hourly runs in O(changes)"): on trees of small
# files made here (--files, default "120000 1000000"; 100 files a
# directory), in the same run:
#   * a no-change hourly run started by the daemon with a valid journal;
#   * a run started by the daemon after 100 files changed (one in each of
#     100 directories);
#   * the same no-change run with --no-journal (a full walk, by hand);
#   * restic's no-change backup of the same tree (Debian's, and the newest
#     built from the Go module proxy when one is cached by bench/restore.sh);
#   * the daemon's memory (its watcher) and the peak RSS of a journal-driven
#     run;
# each a median of --runs, the time each capsule run records for itself
# (from its start to the snapshot stored), restic's wall time.
# With --smb RTT, the first tree of --files is also backed up to Samba through
# the latency proxy at RTT ms (servers from scripts/servers.sh), and the
# no-change journal run's requests and time are given.
#
#   bench/journal.sh [--files "120000 1000000"] [--runs 3] [--smb 10] [--output FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
sizes="120000 1000000" runs=3 smb_rtt="" output=""
while [ $# -gt 0 ]; do
  case $1 in
    --files) sizes=$2; shift ;;
    --runs) runs=$2; shift ;;
    --smb) smb_rtt=$2; shift ;;
    --output) output=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
command -v restic >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq restic >/dev/null; }
command -v /usr/bin/time >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null; }
restic_new=$(ls -t "$HOME"/.cache/capsule-bench/restic-v* 2>/dev/null | head -1 || true)
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /tmp/capsule-journalbench.XXXXXX)
daemon=""
cleanup() {
  [ -n "$daemon" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  if [ -n "${servers_started:-}" ]; then scripts/servers.sh stop "$servers_started" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
unset CAPSULE_PASSWORD CAPSULE_REPO CAPSULE_PROFILE
export RESTIC_PASSWORD=bench


median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
secs() { python3 -c "print(round($2 - $1, 3))"; }
status_field() { "$capsule" --json status | python3 -c "import json,sys; r=json.load(sys.stdin)['profiles'][0]['last_run']; print($1)"; }

rows=()
# measure NAME TREE REPO: the daemon's runs, --no-journal, restic; sets a row.
measure() {
  local name=$1 tree=$2 repo=$3 w=$work/$1
  mkdir -p "$w"
  cat >"$w/capsule.toml" <<TOML
[profiles.p]
sources = ["$tree"]
repository = "$repo"
password-command = "echo bench"
schedule = { backup = "hourly" }
journal-verify-every = 0
TOML
  export CAPSULE_CONFIG=$w/capsule.toml CAPSULE_STATE_DIR=$w/state CAPSULE_CACHE_DIR=$w/cache
  local clock=$w/clock now
  now=$(date +%s)
  echo "$now" >"$clock"
  export CAPSULE_TEST_NOW=@$clock
  "$capsule" -q --profile p init
  "$capsule" -q --profile p backup
  "$capsule" daemon 2>"$w/daemon.log" &
  daemon=$!
  for _ in $(seq 1200); do grep -q watching "$w/daemon.log" && break; sleep 0.1; done
  local watch_rss
  watch_rss=$(awk '/VmRSS/ {print $2}' "/proc/$daemon/status")
  # The first run under the journal makes its base (a full scan).
  run_by_daemon
  local quiet=() modes=() changed=()
  for ((i = 0; i < runs; i++)); do
    run_by_daemon
    quiet+=("$(status_field 'r["duration_secs"]')")
    modes+=("$(status_field 'r["scan"]["mode"]')")
  done
  for ((i = 0; i < runs; i++)); do
    python3 - "$tree" "$i" <<'PY'
import os, sys
root, k = sys.argv[1], int(sys.argv[2])
dirs = sorted(os.path.join(a, b) for a in os.listdir(root) for b in os.listdir(os.path.join(root, a)))
step = max(1, len(dirs) // 100)
for d in dirs[::step][:100]:
    with open(os.path.join(root, d, "f00"), "a") as f:
        f.write("changed %d\n" % k)
PY
    run_by_daemon
    changed+=("$(status_field 'r["duration_secs"]')")
    modes+=("$(status_field 'r["scan"]["mode"]')")
  done
  local daemon_rss daemon_hwm
  daemon_rss=$(awk '/VmRSS/ {print $2}' "/proc/$daemon/status")
  daemon_hwm=$(awk '/VmHWM/ {print $2}' "/proc/$daemon/status")
  # A journal-driven run by hand, for its peak RSS and its requests.
  now=$((now + 60)); echo "$now" >"$clock"
  /usr/bin/time -f %M -o "$w/rss" "$capsule" --profile p --json backup >"$w/hand.json"
  local run_rss requests
  run_rss=$(cat "$w/rss")
  requests=$(python3 -c 'import json,sys; v=json.load(open(sys.argv[1])); print(v["destination"]["requests"], v["scan"]["mode"])' "$w/hand.json")
  local full=()
  for ((i = 0; i < runs; i++)); do
    now=$((now + 60)); echo "$now" >"$clock"
    "$capsule" -q --profile p backup --no-journal
    full+=("$(status_field 'r["duration_secs"]')")
  done
  kill "$daemon"; wait "$daemon" 2>/dev/null || true; daemon=""
  local rest=() rest_new=() t0 t1
  if [ "$name" != smb ]; then
    export RESTIC_REPOSITORY=$w/restic
    restic init -q >/dev/null
    restic backup -q "$tree" >/dev/null
    for ((i = 0; i < runs; i++)); do
      t0=$EPOCHREALTIME; restic backup -q "$tree" >/dev/null; t1=$EPOCHREALTIME
      rest+=("$(secs "$t0" "$t1")")
    done
    if [ -n "$restic_new" ]; then
      export RESTIC_REPOSITORY=$w/restic-new
      "$restic_new" init -q >/dev/null
      "$restic_new" backup -q "$tree" >/dev/null
      for ((i = 0; i < runs; i++)); do
        t0=$EPOCHREALTIME; "$restic_new" backup -q "$tree" >/dev/null; t1=$EPOCHREALTIME
        rest_new+=("$(secs "$t0" "$t1")")
      done
    fi
  fi
  local files
  files=$(find "$tree" -type f | wc -l)
  rows+=("| $name | $files | $(median "${quiet[@]}") | $(median "${changed[@]}") | $(median "${full[@]}") | $([ ${#rest[@]} -gt 0 ] && median "${rest[@]}" || echo —) | $([ ${#rest_new[@]} -gt 0 ] && median "${rest_new[@]}" || echo —) | $(python3 -c "print(round($watch_rss/1024,1), round($daemon_rss/1024,1), round($daemon_hwm/1024,1))") | $(python3 -c "print(round($run_rss/1024,1))") | $requests |")
  echo "${rows[-1]}" >&2
  echo "  runs: no-change ${quiet[*]}; 100 changed ${changed[*]}; --no-journal ${full[*]}; restic ${rest[*]:-} ${rest_new[*]:-}; modes ${modes[*]}" >&2
}

# shellcheck source=bench/lib.sh
source bench/lib.sh
for n in $sizes; do
  tree=$work/tree-$n
  echo "making $n files..." >&2
  make_tree "$tree" "$n"
  sync
  measure "local-$n" "$tree" "$work/repo-$n"
  rm -rf "$work/local-$n/restic" "$work/local-$n/restic-new" "$work/repo-$n"
  [ -n "$smb_rtt" ] && [ "$n" = "${sizes%% *}" ] && smb_tree=$tree || rm -rf "$tree"
done

if [ -n "$smb_rtt" ]; then
  if [ -n "${CAPSULE_TEST_SERVERS:-}" ] && [ -f "$CAPSULE_TEST_SERVERS/env" ]; then
    servers=$CAPSULE_TEST_SERVERS
  else
    servers=$work/servers servers_started=$work/servers
    scripts/servers.sh start "$servers" >&2
  fi
  # shellcheck disable=SC1091
  source "$servers/env"
  api=$CAPSULE_TEST_PROXY_API
  smb=$(proxy journal-smb "$CAPSULE_TEST_SMB_UPSTREAM" "$smb_rtt")
  export CAPSULE_SMB_PASSWORD=$CAPSULE_TEST_SMB_PASSWORD
  measure smb "$smb_tree" "smb://backup@$smb/backup/journal-$RANDOM"
fi

{
  echo "### Change journal (\`bench/journal.sh --files \"$sizes\" --runs $runs${smb_rtt:+ --smb $smb_rtt}\`, $(date -u +%Y-%m-%d))"
  echo
  echo "$(nproc) cores; capsule $("$capsule" --version | cut -d' ' -f2); restic $(restic version | cut -d' ' -f2)${restic_new:+, $("$restic_new" version | cut -d' ' -f2)}; trees of small files, 100 a directory, on this machine's disk; local repositories$([ -n "$smb_rtt" ] && echo "; smb: the ${sizes%% *}-file tree to Samba through Toxiproxy at $smb_rtt ms")."
  echo "Seconds are medians of $runs; capsule's as each run records them (start to snapshot stored), restic's wall time."
  echo
  echo "| tree | files | no-change, daemon + journal, s | 100 changed, daemon + journal, s | no-change, --no-journal, s | restic $(restic version | cut -d' ' -f2), s | restic newest, s | daemon RSS MiB: watching, after runs, peak | journal run peak RSS, MiB | journal run: requests, mode |"
  echo "|---|---:|---:|---:|---:|---:|---:|---|---:|---|"
  printf '%s\n' "${rows[@]}"
} | tee "${output:-/dev/stderr}"
