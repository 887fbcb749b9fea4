#!/usr/bin/env bash
# A simulated year of hourly backups into a fixed space: the Time Machine
# policy daily, a quota, a small loop-mounted file system (bench/year.py has
# the checks). Prints a Markdown summary and writes runs.csv, year.svg and
# summary.md to the output directory. Needs root (loop mount).
#
#   bench/year.sh [--days N] [--files N] [--quota-mib N] [--out DIR]
#
# A full year (8,760 backups) takes about an hour here.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
take_out bench/year "$@"
cargo build --release -q -p capsule
work=$(mktemp -d /tmp/capsule-year.XXXXXX)
trap 'umount "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT
# A copy, so that a rebuild during the (long) run does not change the binary.
cp target/release/capsule "$work/capsule"
python3 bench/year.py --capsule "$work/capsule" --work "$work" --out "$out" "${args[@]}"
