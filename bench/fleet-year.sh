#!/usr/bin/env bash
# A household's year on a distributed store, with everything going wrong:
# 8 hosts back up under the test clock into one repository on MinIO in
# distributed mode (4 nodes × 2 drives in network namespaces) for a
# simulated year, with 1,000 seeded faults (clients, prunes and checks
# killed, nodes killed and cut off, a drive wiped, a full cache disk, clock
# jumps, two runs at once, machines replaced). bench/fleet_year.py does the
# work and the checks; prints a Markdown summary and writes runs.csv,
# faults.csv, fleet-year.svg and summary.md to the output directory.
#
#   bench/fleet-year.sh [--pin] [--seed S] [--days N] [--hosts N] [--faults N]
#                       [--hourly-days N] [--dense-days N] [--out DIR]
#
# The full year needs the machine to itself (beside the test command a day
# took 26-200 s). Time is compressed to fit about an hour: daily runs for
# the first 60 days and the last week, hourly on days 44, 194 and 364, and
# in between only the days a weekly or monthly job falls on (fleet_year.py
# says exactly which). The test command runs a month of
# 3 hosts with 50 faults (crates/cli/tests/fleet_year.rs).
# Needs root (namespaces, tmpfs) and MinIO as scripts/servers.sh builds it.
# Starts a cluster of its own (names capyear-*, 10.231.91.0/24), so it can
# run beside the test command's.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces, tmpfs)" >&2; exit 2; }
[ -x "${CAPSULE_TOOLS_DIR:-$HOME/.cache/capsule-servers/bin}/minio" ] ||
  { echo "no MinIO: run scripts/servers.sh start DIR once (it builds it)" >&2; exit 2; }
# shellcheck source=bench/lib.sh
source bench/lib.sh
take_out bench/fleet-year "$@"
cargo build --release --locked -q -p capsule
dir=$(mktemp -d /tmp/capsule-fleet-cluster.XXXXXX)
trap 'scripts/cluster.sh stop "$dir"; rm -rf "$dir"' EXIT
CAPSULE_CLUSTER_TAG=capyear CAPSULE_CLUSTER_NET=10.231.91 scripts/cluster.sh start "$dir"
# A copy, so that a rebuild during the (long) run does not change the binary.
cp target/release/capsule "$dir/capsule"
# shellcheck disable=SC1091
source "$dir/cluster.env"
CLUSTER_CTL=$PWD/scripts/cluster.sh \
  python3 bench/fleet_year.py --capsule "$dir/capsule" --out "$out" "${args[@]}"
