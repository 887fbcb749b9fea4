#!/usr/bin/env bash
# The page's latency (issue "Go back in time"): a directory of 10,000
# entries, in a snapshot of 30,200 files in a local repository, opened
#   * through `capsule ui`'s API, on a fresh process (first) and again
#     (warm, median of 10);
#   * in the page, in headless Chromium: from the call that opens it to the
#     10,000 rows drawn, first and warm;
# against a process per view, as restic's web front ends work: `capsule ls`
# and `restic ls` 0.14 of the same directory (median of 5). The target: a
# warm open under 0.2 s. And the timeline of a repository of 10,000 hourly
# snapshots of one source (written by bench's blobgen), listed by the API
# and drawn in the page, first and warm; the target: under 0.5 s. The
# measuring is the ignored tests `page_latency_of_a_10k_entry_directory`
# and `page_latency_of_a_10k_snapshot_timeline` in
# crates/cli/tests/ui_browser.rs, built in release.
#
#   bench/page.sh [--output FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
output=""
while [ $# -gt 0 ]; do
  case $1 in
    --output) output=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
command -v restic >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq restic >/dev/null; }
command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo build --release -q -p capsule-bench --bin blobgen
CAPSULE_BLOBGEN=$PWD/target/release/blobgen \
  cargo test --release -q -p capsule --test ui_browser page_latency -- --ignored --nocapture --test-threads 1 >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
{
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); $(chromium --version 2>/dev/null); $(restic version | cut -d' ' -f1-2); capsule $(git rev-parse --short HEAD)"
  echo "Command: bench/page.sh"
  echo
  # A table's first line may follow the test harness's progress dot.
  sed -n 's/^[.]*\(|.*\)/\1/p' "$log" | awk '/^\| a timeline/ { print "" } { print }'
} | tee ${output:+"$output"}
