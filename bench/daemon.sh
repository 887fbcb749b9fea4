#!/usr/bin/env bash
# The daemon's costs (issue "It runs by itself"):
#   * idle between runs: its resident memory and the CPU it uses, measured
#     over --secs seconds and given per hour;
#   * a scheduled no-change run started by the daemon against
#     `capsule --profile p backup` of the same tree by hand, in the same run
#     (medians of --runs; the duration each run records for itself).
#
#   bench/daemon.sh [--tree DIR] [--secs N] [--runs N]
set -euo pipefail
cd "$(dirname "$0")/.."
tree="" secs=60 runs=3
while [ $# -gt 0 ]; do
  case $1 in
    --tree) tree=$2; shift ;;
    --secs) secs=$2; shift ;;
    --runs) runs=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$tree" ] || tree=$(ls -d "$HOME"/.rustup/toolchains/stable-*/share/doc 2>/dev/null | head -1)
[ -d "$tree" ] || { echo "no tree to use (give --tree DIR)" >&2; exit 2; }
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /tmp/capsule-daemonbench.XXXXXX)
trap 'kill "${daemon:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
cat >"$work/capsule.toml" <<TOML
[profiles.p]
sources = ["$tree"]
repository = "$work/repo"
password-command = "echo bench"
schedule = { backup = "hourly" }
TOML
export CAPSULE_CONFIG=$work/capsule.toml CAPSULE_STATE_DIR=$work/state CAPSULE_CACHE_DIR=$work/cache
unset CAPSULE_PASSWORD CAPSULE_REPO CAPSULE_PROFILE
clock=$work/clock
now=$(date +%s)
echo "$now" >"$clock"
export CAPSULE_TEST_NOW=@$clock
last_secs() { "$capsule" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["profiles"][0]["last_run"]["duration_secs"])'; }
last_key() { "$capsule" --json status | python3 -c 'import json,sys; print(json.load(sys.stdin)["profiles"][0]["last_run"].get("key", "?"))'; }
last_start() { "$capsule" --json status | python3 -c 'import json,sys; r=json.load(sys.stdin)["profiles"][0]["last_success"]; print(r["started_unix"] if r else 0)'; }
"$capsule" -q --profile p init
"$capsule" -q --profile p backup
files=$(find "$tree" -type f | wc -l)
hand=() by_daemon=() hand_keys=() daemon_keys=()
for ((i = 0; i < runs; i++)); do
  now=$((now + 3600)); echo "$now" >"$clock"
  "$capsule" -q --profile p backup
  hand+=("$(last_secs)")
  hand_keys+=("$(last_key)")
done
"$capsule" daemon 2>"$work/daemon.log" &
daemon=$!
for ((i = 0; i < runs; i++)); do
  now=$((now + 3600)); echo "$now" >"$clock"
  for _ in $(seq 600); do [ "$(last_start)" = "$now" ] && break; sleep 0.1; done
  [ "$(last_start)" = "$now" ] || { echo "the daemon made no run at $now" >&2; cat "$work/daemon.log" >&2; exit 1; }
  by_daemon+=("$(last_secs)")
  daemon_keys+=("$(last_key)")
done
sleep 2
ticks() { awk '{print $14 + $15}' "/proc/$daemon/stat"; }
hz=$(getconf CLK_TCK)
t0=$(ticks); sleep "$secs"; t1=$(ticks)
rss=$(awk '/VmRSS/ {print $2}' "/proc/$daemon/status")
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$daemon/status")
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
cpu_per_hour=$(python3 -c "print(round(($t1 - $t0) / $hz * 3600 / $secs, 3))")
cat <<OUT
### The daemon (\`bench/daemon.sh --secs $secs --runs $runs\`, $(date -u +%Y-%m-%d))

Tree: $tree ($files files), local repository; $(nproc) cores; capsule $("$capsule" --version | cut -d' ' -f2).

| measure | value |
|---|---|
| no-change run by hand (\`capsule --profile p backup\`), median of $runs, s | $(median "${hand[@]}") (runs: ${hand[*]}; key: ${hand_keys[*]}) |
| no-change run started by the daemon, median of $runs, s | $(median "${by_daemon[@]}") (runs: ${by_daemon[*]}; key: ${daemon_keys[*]}) |
| daemon idle RSS, MiB (peak) | $(python3 -c "print(round($rss / 1024, 1))") ($(python3 -c "print(round($hwm / 1024, 1))")) |
| daemon idle CPU, s per hour (measured over $secs s) | $cpu_per_hour |

The duration is the one each run records (from the start of the backup
command to its end, key derivation included). "key" is how each run had
its key: \`early\` (derived from this machine's hint while connecting, as
every run by hand), \`held\` (handed over by the daemon: no derivation).
The daemon's peak RSS includes its one key derivation (Argon2id, 64 MiB,
freed at once); the idle RSS is what it holds between runs.
OUT
