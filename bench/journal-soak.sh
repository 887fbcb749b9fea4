#!/usr/bin/env bash
# The change journal's model test, soaked: STEPS seeded random mutations per
# watcher (inotify on a tmpfs source, fanotify on a tmpfs of its own), with
# hard links kept outside the sources and written through, and a directory
# bind-mounted below the source written through its other path; after every
# step the journal-driven backup must equal a full scan. Needs root (mounts,
# fanotify). Usage: bench/journal-soak.sh [STEPS] (default 2000).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-2000}
for w in inotify fanotify; do
  echo "== $w, $steps steps"
  CAPSULE_MODEL_STEPS=$steps CAPSULE_MODEL_SECS=7200 \
    cargo test -q -p capsule-watch --test model \
    "a_journal_driven_backup_equals_a_full_scan_after_random_changes_$w" -- --nocapture 2>&1 \
    | grep -E "model seed|journal used|stopped|panicked|differs|test result"
done
