#!/usr/bin/env bash
# A distributed, erasure-coded S3 store on this machine, for the tests and
# benchmarks of many clients on one store: MinIO in distributed mode, four
# server processes with two drives each (eight drives, erasure-coded; reads
# survive the loss of half of them, writes need half plus one).
#
# MinIO will not form a cluster from loopback addresses, so each node runs
# in a network namespace of its own, with its own address on a bridge
# (a veth pair per node). These namespaces are the project's own test hosts:
# their traffic stays between them and this machine.
#
#   scripts/cluster.sh start DIR        start the four nodes; write DIR/cluster.env
#   scripts/cluster.sh stop DIR         stop them (by PID) and remove the
#                                       namespaces, veth pairs and bridge
#   scripts/cluster.sh kill N DIR       SIGKILL node N (1-4): a node lost
#   scripts/cluster.sh restart N DIR    start node N again
#   scripts/cluster.sh wipe N D DIR     empty node N's drive D (1-2): a disk
#                                       replaced; the store heals it
#   scripts/cluster.sh status DIR       which nodes run, and the store's health
#
# Needs root, iproute2 and MinIO as scripts/servers.sh builds it.
# CAPSULE_CLUSTER_NET (default 10.231.77) is the bridge's /24 and
# CAPSULE_CLUSTER_TAG (default capsule, at most 10 characters) names the
# bridge, namespaces and veth pairs, so that a second cluster (a benchmark
# beside a test run) can run at once with other values of both.
set -euo pipefail

usage="usage: cluster.sh start|stop|status DIR | kill|restart N DIR | wipe N D DIR"
cmd=${1:?$usage}
shift
case "$cmd" in
  kill | restart) node=${1:?$usage}; shift ;;
  wipe) node=${1:?$usage}; drive=${2:?$usage}; shift 2 ;;
esac
dir=${1:?$usage}
mkdir -p "$dir/cluster"
dir=$(cd "$dir" && pwd)
tools=${CAPSULE_TOOLS_DIR:-$HOME/.cache/capsule-servers/bin}

NODES=4 DRIVES=2 PORT=9000
# The names `start` chose are kept with the cluster, so that kill, restart,
# wipe and stop find its namespaces whatever the caller's environment.
names="$dir/cluster/names"
if [ "$cmd" != start ] && [ -f "$names" ]; then
  # shellcheck disable=SC1090
  . "$names"
fi
NET=${CAPSULE_CLUSTER_NET:-10.231.77}
TAG=${CAPSULE_CLUSTER_TAG:-capsule}
BRIDGE=$TAG-br0
S3_KEY=capsule S3_SECRET=capsule-secret-key
BUCKET=capsule-test

log() { echo "cluster: $*" >&2; }
ns() { echo "$TAG-n$1"; }
addr() { echo "$NET.$((10 + $1))"; }
pidfile() { echo "$dir/cluster/n$1.pid"; }

# Every node is started with all eight drives written out: node I's drives
# are its own directories of this machine's disk.
endpoints() {
  local i d
  for ((i = 1; i <= NODES; i++)); do
    for ((d = 1; d <= DRIVES; d++)); do
      printf 'http://%s:%s%s/cluster/n%s/d%s ' "$(addr "$i")" "$PORT" "$dir" "$i" "$d"
    done
  done
}

net_up() {
  [ "$(id -u)" = 0 ] || { log "needs root (network namespaces)"; return 1; }
  command -v ip >/dev/null || { log "needs iproute2 (ip)"; return 1; }
  [ -x "$tools/minio" ] || { log "no MinIO in $tools: run scripts/servers.sh start first"; return 1; }
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  local i
  for ((i = 1; i <= NODES; i++)); do
    ip netns list | grep -qw "$(ns "$i")" && continue
    ip netns add "$(ns "$i")"
    ip link add "$TAG-v$i" type veth peer name "$TAG-v${i}n"
    ip link set "$TAG-v${i}n" netns "$(ns "$i")"
    ip link set "$TAG-v$i" master "$BRIDGE" up
    ip -n "$(ns "$i")" addr add "$(addr "$i")/24" dev "$TAG-v${i}n"
    ip -n "$(ns "$i")" link set "$TAG-v${i}n" up
    ip -n "$(ns "$i")" link set lo up
  done
}

net_down() {
  local i
  for ((i = 1; i <= NODES; i++)); do
    ip link del "$TAG-v$i" 2>/dev/null || true
    ip netns del "$(ns "$i")" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

running() { # node
  local f
  f=$(pidfile "$1")
  [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null
}

start_node() { # node
  running "$1" && return 0
  local d
  for ((d = 1; d <= DRIVES; d++)); do mkdir -p "$dir/cluster/n$1/d$d"; done
  # shellcheck disable=SC2046 # the endpoints are eight words
  ip netns exec "$(ns "$1")" env MINIO_ROOT_USER=$S3_KEY MINIO_ROOT_PASSWORD=$S3_SECRET \
    MINIO_BROWSER=off MINIO_CI_CD=on \
    setsid "$tools/minio" server --address "$(addr "$1"):$PORT" $(endpoints) \
    >>"$dir/cluster/n$1.log" 2>&1 &
  echo $! >"$(pidfile "$1")"
}

stop_node() { # node signal
  local f pid i
  f=$(pidfile "$1")
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  kill "-$2" "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}

healthy() { # seconds: the store has its write quorum
  local i
  for ((i = 0; i < $1 * 5; i++)); do
    curl -fs -o /dev/null "http://$(addr 1):$PORT/minio/health/cluster" && return 0
    sleep 0.2
  done
  return 1
}

write_env() {
  local i nodes=""
  for ((i = 1; i <= NODES; i++)); do nodes="$nodes $(addr "$i"):$PORT"; done
  cat >"$dir/cluster.env" <<EOF
export CAPSULE_TEST_CLUSTER=s3+http://$(addr 1):$PORT/$BUCKET
export CAPSULE_TEST_CLUSTER_NODES="${nodes# }"
export CAPSULE_TEST_CLUSTER_DIR=$dir
export CAPSULE_TEST_CLUSTER_KEY=$S3_KEY
export CAPSULE_TEST_CLUSTER_SECRET=$S3_SECRET
EOF
}

case "$cmd" in
  start)
    net_up
    printf 'CAPSULE_CLUSTER_NET=%s\nCAPSULE_CLUSTER_TAG=%s\n' "$NET" "$TAG" >"$names"
    for ((i = 1; i <= NODES; i++)); do start_node "$i"; done
    healthy 60 || { log "no write quorum after 60 s; see $dir/cluster/n*.log"; exit 1; }
    curl -fs -X PUT --user "$S3_KEY:$S3_SECRET" --aws-sigv4 "aws:amz:us-east-1:s3" \
      "http://$(addr 1):$PORT/$BUCKET" >/dev/null ||
      curl -fs --user "$S3_KEY:$S3_SECRET" --aws-sigv4 "aws:amz:us-east-1:s3" \
        "http://$(addr 1):$PORT/$BUCKET?location" >/dev/null ||
      { log "cannot create the bucket $BUCKET"; exit 1; }
    write_env
    log "ready: $NODES nodes × $DRIVES drives; source $dir/cluster.env"
    ;;
  stop)
    for ((i = 1; i <= NODES; i++)); do stop_node "$i" TERM; done
    net_down
    ;;
  kill) stop_node "$node" KILL ;;
  restart) start_node "$node" ;;
  wipe)
    # Swapped for an empty directory at once (a disk replaced), then the
    # old one removed: deleting in place races with the node's own writes.
    d="$dir/cluster/n$node/d$drive"
    mv "$d" "$d.wiped.$$"
    mkdir "$d"
    rm -rf "$d.wiped.$$"
    ;;
  status)
    for ((i = 1; i <= NODES; i++)); do
      if running "$i"; then echo "node $i ($(addr "$i")): running"; else echo "node $i ($(addr "$i")): stopped"; fi
    done
    if healthy 1; then echo "store: write quorum"; else echo "store: no write quorum"; fi
    ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
