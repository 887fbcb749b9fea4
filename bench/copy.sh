#!/usr/bin/env bash
# Copying out of a network repository: `capsule copy` from S3, SFTP and SMB
# (real MinIO, OpenSSH, Samba on loopback, through Toxiproxy at each RTT)
# into a local repository, against `restic copy` of the same data and
# against capsule's own restore of the same snapshot (what reading those
# packs costs). Prints Markdown.
#
#   bench/copy.sh [--pin] [--mib N] [--small N] [--rtt "10"]
#
# The data: N MiB (default 512) in 16 random files and SMALL (default 2000)
# random files of 16 KiB. Two local targets: a repository made with
# `init --copy-chunker-params-from` (blobs copied as they are) and one
# made on its own (every file cut again: the source's blobs are read and
# fed to a new chunker). Page cache dropped before every run.
set -euo pipefail
cd "$(dirname "$0")/.."

mib=512 small=2000 rtts="10" pin_it=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pin) pin_it=1 ;;
    --mib) mib=$2; shift ;;
    --small) small=$2; shift ;;
    --rtt) rtts=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$(id -u)" != 0 ]; then echo "needs root (drop_caches, apt-get)" >&2; exit 2; fi
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /tmp/capsule-copybench.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
use_servers
need restic:restic rclone:rclone jq:jq
net_bench_env

echo "generating $mib MiB and $small small files in $work" >&2
mkdir -p "$work/data/small"
for i in $(seq 0 15); do head -c $((mib * 1048576 / 16)) /dev/urandom >"$work/data/f$i"; done
python3 -c "
import os, sys
for i in range($small):
    open(os.path.join(sys.argv[1], 'f%05d' % i), 'wb').write(os.urandom(16384))
" "$work/data/small"
sync
total=$(du -sm "$work/data" | cut -f1)

# The source repositories, written once without the proxy.
mkdir -p "$smb_dir/$name-c" "$smb_dir/$name-r" "$sftp_dir/$name-c"
for dest in S3 SFTP SMB; do
  up=$(eval echo "\$CAPSULE_TEST_${dest}_UPSTREAM")
  "$capsule" -r "$(capsule_url $dest "$up")" -q init
  "$capsule" -r "$(capsule_url $dest "$up")" -q backup "$work/data"
  restic_on $dest "$up" init -q >/dev/null
  restic_on $dest "$up" backup -q "$work/data" >/dev/null
done

rows=()
for rtt in $rtts; do
  proxies "c$rtt" "$rtt"
  for dest in S3 SFTP SMB; do
    lower=$(echo "$dest" | tr 'A-Z' 'a-z')
    host=${!lower}
    url=$(capsule_url $dest "$host")
    rm -rf "$work/out" "$work/same" "$work/own" "$work/restic-local"
    cold; restored=$(wall "$capsule" -r "$url" -q --no-cache restore latest --target "$work/out")
    rm -rf "$work/out"
    "$capsule" -r "$work/same" -q init --copy-chunker-params-from "$url"
    cold; same=$(wall "$capsule" -r "$url" -q --no-cache copy --to "$work/same")
    "$capsule" -r "$work/own" -q init
    cold; own=$(wall "$capsule" -r "$url" -q --no-cache copy --to "$work/own")
    # Both copies must hold the same files as the source.
    for t in same own; do
      "$capsule" -r "$work/$t" -q restore latest --target "$work/check-$t"
      diff -rq "$work/data" "$work/check-$t$work/data" >/dev/null || { echo "copy to $t differs from the source" >&2; exit 1; }
      rm -rf "$work/check-$t"
    done
    restic -r "$work/restic-local" init -q >/dev/null
    cold; r=$(wall restic_on $dest "$host" -r "$work/restic-local" copy --from-repo "$(restic_repo $dest "$host")")
    rows+=("$dest|$rtt|$restored s, $(per_sec "$restored" "$total")|$same s, $(per_sec "$same" "$total")|$own s, $(per_sec "$own" "$total")|$r s, $(per_sec "$r" "$total")")
    echo "  $dest $rtt ms: restore $restored s, copy (same chunker) $same s, copy (re-chunked) $own s, restic copy $r s" >&2
  done
done

rm -rf "${smb_dir:?}/$name-c" "${smb_dir:?}/$name-r" "${sftp_dir:?}/$name-c" "${sftp_dir:?}/$name-r"
echo
echo "$total MiB ($mib MiB in 16 files, $small files of 16 KiB); cold page cache before every run; $( [ "$pin_it" = 1 ] && echo "servers and proxy pinned to the last core" || echo "unpinned" )"
echo
echo "| source | RTT ms | capsule restore (the reading's reference) | capsule copy, chunker shared | capsule copy, cut again | restic copy |"
echo "|---|---|---|---|---|---|"
for row in "${rows[@]}"; do echo "| ${row//|/ | } |"; done
