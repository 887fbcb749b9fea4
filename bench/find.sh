#!/usr/bin/env bash
# `capsule find` over a long hourly history (issue 61): N snapshots of a
# tree of F files, each run after a few files changed, then find by name
# (a pattern matching a handful of paths, and one matching a file in every
# directory) across all of them: seconds, peak memory, trees read.
#
#   bench/find.sh [--snapshots N] [--files F] [--output FILE]
#
# Defaults: 1,000 snapshots of 100,000 files (about 20 minutes to build on
# 2 cores). restic's `find` over the same history is left out: building it
# takes restic a minute or more per 100 snapshots of this tree.
set -euo pipefail
cd "$(dirname "$0")/.."

snaps=1000 files=100000 output=""
while [ $# -gt 0 ]; do
  case "$1" in
    --snapshots) snaps=$2; shift ;;
    --files) files=$2; shift ;;
    --output) output=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/capsule-find.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CAPSULE_PASSWORD=bench
python3 - "$work/src" "$files" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"p{i % 100:02}", f"d{i // 100 % 10}")
    os.makedirs(d, exist_ok=True)
    ext = "pdf" if i % 20000 == 7 else "txt"
    with open(os.path.join(d, f"f{i:06}.{ext}"), "wb") as f:
        f.write(str(i).encode())
EOF
"$capsule" -r "$work/repo" -q init
t0=$(date +%s)
for ((k = 0; k < snaps; k++)); do
  # A few files change each hour, one of them a PDF now and then.
  python3 - "$work/src" "$files" "$k" <<'EOF'
import os, sys
root, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for j in range(5):
    i = (k * 7919 + j * 104729) % n
    ext = "pdf" if i % 20000 == 7 else "txt"
    p = os.path.join(root, f"p{i % 100:02}", f"d{i // 100 % 10}", f"f{i:06}.{ext}")
    with open(p, "ab") as f:
        f.write(b".")
EOF
  "$capsule" -r "$work/repo" -q backup --no-journal "$work/src" >/dev/null
done
built=$(($(date +%s) - t0))
rows=()
for pat in '*.pdf' 'f0000??.txt'; do
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$work/rss" "$capsule" -r "$work/repo" --json find "$pat" >"$work/out.json"
  t1=$(date +%s.%N)
  secs=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$t1")
  read -r paths versions trees < <(python3 -c "
import json,sys; v=json.load(open(sys.argv[1]))
print(len(v['found']), sum(len(f['versions']) for f in v['found']), v['trees_read'])" "$work/out.json")
  rows+=("\`find '$pat'\`|$paths|$versions|$trees|$secs|$(($(cat "$work/rss") / 1024))")
done
{
  echo "## Finding a file across a long history"
  echo
  echo "*Run:* $(date -u +%Y-%m-%d), \`bench/find.sh --snapshots $snaps --files $files\`; $snaps snapshots of $files files, 5 changed between runs (history built in ${built} s)."
  echo
  echo "| search | paths found | versions | trees read | seconds | peak RSS MiB |"
  echo "|---|---|---|---|---|---|"
  for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
} >"$work/table.md"
cat "$work/table.md"
[ -z "$output" ] || cp "$work/table.md" "$output"
