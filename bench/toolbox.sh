#!/usr/bin/env bash
# The everyday toolbox against peers (issue 61), same data, same run, local
# repositories on the same disk:
#  1. a database dump backed up from a command on three nights, 1 % of its
#     rows updated (a run of them, as a day's orders are) and a few appended
#     each night: seconds and bytes added per night;
#  2. one 4 GiB file printed to standard output (`dump`, borg `extract
#     --stdout`), repository read from disk: seconds and peak memory;
#  3. a 50,000-file folder as a tar stream (`dump`, borg `export-tar`).
#
#   bench/toolbox.sh [--dump-mib N] [--big-gib N] [--files N] [--output FILE]
#
# Defaults: a 1,024 MiB dump, a 4 GiB file, 50,000 files of 4 KiB. restic
# 0.19.0 is built from the Go module proxy into ~/.cache/capsule-bench when
# missing (Debian's 0.14 has no --stdin-from-command); borg from Debian.
set -euo pipefail
cd "$(dirname "$0")/.."

dump_mib=1024 big_gib=4 nfiles=50000 output=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dump-mib) dump_mib=$2; shift ;;
    --big-gib) big_gib=$2; shift ;;
    --files) nfiles=$2; shift ;;
    --output) output=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

peers=${XDG_CACHE_HOME:-$HOME/.cache}/capsule-bench
restic=$peers/restic-0.19.0
if [ ! -x "$restic" ]; then
  mkdir -p "$peers"
  # The sum database does not list this tag; the module proxy serves it.
  GOBIN=$peers/gobin GOPATH=$peers/gopath GOSUMDB=off GOFLAGS=-mod=mod \
    go install github.com/restic/restic/cmd/restic@v0.19.0
  mv "$peers/gobin/restic" "$restic"
fi
command -v borg >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq borgbackup >/dev/null
}
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/capsule-toolbox.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CAPSULE_PASSWORD=bench RESTIC_PASSWORD=bench BORG_PASSPHRASE=bench
export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes

drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
# timed CMD...: wall seconds of CMD in $last, its peak RSS (MiB) in $rss.
timed() {
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$work/rss" "$@" >"$work/last.out" 2>"$work/last.log" || {
    tail -5 "$work/last.log" >&2
    exit 1
  }
  t1=$(date +%s.%N)
  last=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$t1")
  rss=$(($(cat "$work/rss") / 1024))
}
# timed_to_null CMD...: as timed, standard output thrown away.
timed_to_null() {
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$work/rss" "$@" >/dev/null 2>"$work/last.log" || {
    tail -5 "$work/last.log" >&2
    exit 1
  }
  t1=$(date +%s.%N)
  last=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$t1")
  rss=$(($(cat "$work/rss") / 1024))
}
size() { du -sb "$1" | cut -f1; }
mib() { python3 -c "import sys; print(f'{int(sys.argv[1]) / 1048576:.1f}')" "$1"; }

# A text dump of an orders table, as pg_dump writes one, of about
# $dump_mib MiB; night N updates 1 % of the rows (a run of them) and
# appends 0.1 %.
gen_dump() {
  python3 - "$dump_mib" "$1" >"$work/shop.sql" <<'EOF'
import sys
mib, night = int(sys.argv[1]), int(sys.argv[2])
rows = mib * 1048576 // 52
out = sys.stdout
out.write("--\n-- PostgreSQL database dump\n--\n\nCOPY public.orders (id, customer, amount, note) FROM stdin;\n")
runs = [(n * rows * 23 // 100 % rows, n) for n in range(1, night + 1)]
buf = []
for i in range(rows + night * rows // 1000):
    x = (i * 0x9E3779B97F4A7C15 >> 7) & 0xFFFFFFFFFFFF
    for start, n in runs:
        if start <= i < start + rows // 100:
            x += 7919 * n
    buf.append(f"{i}\tcustomer-{x % 5000}\t{x % 100000}.{x % 100:02}\tnote {x:x}\n")
    if len(buf) >= 10000:
        out.write("".join(buf))
        buf.clear()
out.write("".join(buf))
out.write("\\.\n\n-- PostgreSQL database dump complete\n")
EOF
}

"$capsule" -r "$work/capsule" -q init
"$restic" -r "$work/restic" init -q >/dev/null
borg init -e repokey-blake2 "$work/borg"

dump_rows=()
for night in 1 2 3; do
  gen_dump $((night - 1))
  bytes=$(size "$work/shop.sql")
  before=$(size "$work/capsule")
  timed "$capsule" -r "$work/capsule" -q backup --stdin-from-command --stdin-filename shop.sql -- cat "$work/shop.sql"
  c_s=$last c_rss=$rss c_add=$(($(size "$work/capsule") - before))
  before=$(size "$work/restic")
  timed "$restic" -r "$work/restic" backup -q --stdin-from-command --stdin-filename shop.sql -- cat "$work/shop.sql"
  r_s=$last r_rss=$rss r_add=$(($(size "$work/restic") - before))
  before=$(size "$work/borg")
  timed borg create --content-from-command --stdin-name shop.sql "$work/borg::night$night" -- cat "$work/shop.sql"
  b_s=$last b_rss=$rss b_add=$(($(size "$work/borg") - before))
  dump_rows+=("$night|$(mib "$bytes")|$c_s|$(mib "$c_add")|$c_rss|$r_s|$(mib "$r_add")|$r_rss|$b_s|$(mib "$b_add")|$b_rss")
done
rm -f "$work/shop.sql"
# capsule reads back what it stored: the third night's dump.
gen_dump 2
"$capsule" -r "$work/capsule" -q dump latest /shop.sql | cmp -s - "$work/shop.sql" || { echo "capsule dumped wrong data" >&2; exit 1; }
rm -rf "$work/shop.sql" "$work/capsule" "$work/restic" "$work/borg"

# One big file, and a folder of small ones.
mkdir -p "$work/src/files"
head -c "${big_gib}G" /dev/urandom >"$work/src/big.bin"
python3 - "$work/src/files" "$nfiles" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"d{i % 100:02}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:06}"), "wb") as f:
        f.write(os.urandom(2048) + bytes(2048))
EOF
"$capsule" -r "$work/capsule" -q init
"$capsule" -r "$work/capsule" -q backup "$work/src"
"$restic" -r "$work/restic" init -q >/dev/null
"$restic" -r "$work/restic" backup -q "$work/src" >/dev/null
borg init -e repokey-blake2 "$work/borg"
(cd / && borg create "$work/borg::a" "${work#/}/src")
"$capsule" -r "$work/capsule" -q dump latest "$work/src/big.bin" | cmp -s - "$work/src/big.bin" || { echo "capsule dumped wrong data" >&2; exit 1; }

big_rows=() tar_rows=()
drop; timed_to_null "$capsule" -r "$work/capsule" --no-cache -q dump latest "$work/src/big.bin"
big_rows+=("capsule dump|$last|$rss")
drop; timed_to_null "$restic" -r "$work/restic" --no-cache dump latest "$work/src/big.bin"
big_rows+=("restic 0.19.0 dump|$last|$rss")
drop; timed_to_null borg extract --stdout "$work/borg::a" "${work#/}/src/big.bin"
big_rows+=("borg $(borg --version | cut -d' ' -f2) extract --stdout|$last|$rss")
drop; timed_to_null "$capsule" -r "$work/capsule" --no-cache -q dump latest "$work/src/files"
tar_rows+=("capsule dump (tar)|$last|$rss")
drop; timed_to_null "$restic" -r "$work/restic" --no-cache dump latest "$work/src/files"
tar_rows+=("restic 0.19.0 dump (tar)|$last|$rss")
drop; timed_to_null borg export-tar "$work/borg::a" - "${work#/}/src/files"
tar_rows+=("borg export-tar|$last|$rss")

{
  echo "## The everyday toolbox: dumps from a command, dump to stdout"
  echo
  echo "*Run:* $(date -u +%Y-%m-%d), \`bench/toolbox.sh --dump-mib $dump_mib --big-gib $big_gib --files $nfiles\`;"
  echo "capsule $("$capsule" --version | cut -d' ' -f2), restic 0.19.0, borg $(borg --version | cut -d' ' -f2); local repositories, page cache dropped before each dump."
  echo
  echo "A database dump backed up from a command (\`cat shop.sql\` standing in for pg_dump), three nights, 1 % of rows updated and 0.1 % appended each night:"
  echo
  echo "| night | dump MiB | capsule s | capsule MiB added | capsule RSS MiB | restic s | restic MiB added | restic RSS MiB | borg s | borg MiB added | borg RSS MiB |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for r in "${dump_rows[@]}"; do echo "| ${r//|/ | } |"; done
  echo
  echo "One ${big_gib} GiB file to standard output, and ${nfiles} files (4 KiB each) as a tar stream:"
  echo
  echo "| what | seconds | peak RSS MiB |"
  echo "|---|---|---|"
  for r in "${big_rows[@]}" "${tar_rows[@]}"; do echo "| ${r//|/ | } |"; done
} >"$work/table.md"
cat "$work/table.md"
[ -z "$output" ] || cp "$work/table.md" "$output"
