#!/usr/bin/env bash
# Many machines, one distributed store: 32 capsule clients back up in rounds
# into one repository on MinIO in distributed mode (4 nodes × 2 drives, each
# node in a network namespace of its own), forget + prune in a loop beside
# them, a node killed and back, a client paused across two prunes, a drive
# emptied; then check --read-data, restores of every host, stored bytes
# against the distinct data, a no-change run against one alone, and the
# first round's throughput against a plain parallel PUT of the same bytes.
# Prints a Markdown table (bench/cluster.py does the work).
#
#   bench/cluster.sh [--pin] [--clients N] [--rounds R] [--mib M] [--shared F]
#                     [--uplink MBIT] [--alone]
#
# --pin puts the store's four nodes on the last core and the clients on the
# others, as a NAS or object store has CPUs of its own; run it both ways.
# Needs root (namespaces) and MinIO as scripts/servers.sh builds it. Starts
# a cluster of its own (names capbench-*, 10.231.90.0/24), so it can run
# beside the test command's.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 2; }
[ -x "${CAPSULE_TOOLS_DIR:-$HOME/.cache/capsule-servers/bin}/minio" ] ||
  { echo "no MinIO: run scripts/servers.sh start DIR once (it builds it)" >&2; exit 2; }
cargo build --release --locked -q -p capsule
dir=$(mktemp -d /tmp/capsule-cluster.XXXXXX)
trap 'scripts/cluster.sh stop "$dir"; rm -rf "$dir"' EXIT
CAPSULE_CLUSTER_TAG=capbench CAPSULE_CLUSTER_NET=10.231.90 scripts/cluster.sh start "$dir"
# shellcheck disable=SC1091
source "$dir/cluster.env"
CAPSULE_BIN=$PWD/target/release/capsule CLUSTER_CTL=$PWD/scripts/cluster.sh \
  python3 bench/cluster.py "$@"
