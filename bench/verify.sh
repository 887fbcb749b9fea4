#!/usr/bin/env bash
# Verifying over the network: `capsule check --read-data` against restic's
# `check --read-data` on the same data, and against what the link itself
# gives (four plain readers of the repository's pack files through the same
# proxy: curl for S3, sftp and smbclient), on real MinIO, OpenSSH and Samba
# on loopback, at 0 and 10 ms round trip (Toxiproxy). Prints Markdown.
#
#   bench/verify.sh [--pin] [--mib N] [--rtt "0 10"]
#
# The data: N MiB (default 1024) of random bytes in 16 files, one capsule
# and one restic repository per destination. Every check starts with the
# page cache dropped, so the servers read from the disk as a NAS does.
# --pin puts the servers and the proxy on the last core (a NAS has CPUs of
# its own) and the clients on the others.
set -euo pipefail
cd "$(dirname "$0")/.."

mib=1024 rtts="0 10" pin_it=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pin) pin_it=1 ;;
    --mib) mib=$2; shift ;;
    --rtt) rtts=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$(id -u)" != 0 ]; then echo "needs root (drop_caches, apt-get)" >&2; exit 2; fi
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /tmp/capsule-verifybench.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
use_servers
need restic:restic rclone:rclone smbclient:smbclient jq:jq
net_bench_env

echo "generating $mib MiB in $work" >&2
mkdir -p "$work/data"
for i in $(seq 0 15); do
  head -c $((mib * 1048576 / 16)) /dev/urandom >"$work/data/f$i"
done
sync

# The repositories, written once without the proxy.
"$capsule" -r "$work/local" -q init && "$capsule" -r "$work/local" -q backup "$work/data"
mkdir -p "$smb_dir/$name-c" "$smb_dir/$name-r" "$sftp_dir/$name-c"
for dest in S3 SFTP SMB; do
  up=$(eval echo "\$CAPSULE_TEST_${dest}_UPSTREAM")
  "$capsule" -r "$(capsule_url $dest "$up")" -q init
  "$capsule" -r "$(capsule_url $dest "$up")" -q backup "$work/data"
  restic_on $dest "$up" init -q >/dev/null
  restic_on $dest "$up" backup -q "$work/data" >/dev/null
done

# The link's own rate: the capsule repository's pack files read by four
# plain clients at once (each a quarter of the files), through the proxy.
packs() { (cd "$1" && find data -type f | sort); }
link_s3() {
  local host=$1
  packs_s3=$(curl -sS --aws-sigv4 aws:amz:us-east-1:s3 --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
    "http://$CAPSULE_TEST_S3_UPSTREAM/capsule-test?list-type=2&max-keys=1000&prefix=$name-c" |
    grep -o '<Key>[^<]*</Key>' | sed 's/<[^>]*>//g' | grep /data/)
  # (a listing of more than 1,000 objects would need continuation: the
  # data here is a few dozen packs)
  echo "$packs_s3" | xargs -P 4 -I{} curl -sS -f -o /dev/null --aws-sigv4 aws:amz:us-east-1:s3 \
    --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" "http://$host/capsule-test/{}"
}
link_sftp() {
  local host=$1 i
  packs "$sftp_dir/$name-c" >"$work/packs"
  for i in 0 1 2 3; do
    awk -v i=$i -v d="$sftp_dir/$name-c" 'NR % 4 == i { print "get " d "/" $0 " /dev/null" }' "$work/packs" >"$work/batch$i"
    sftp -q $ssh_opts -P "${host#*:}" -b "$work/batch$i" "root@${host%:*}" >/dev/null &
  done
  wait
}
link_smb() {
  local host=$1 i
  packs "$smb_dir/$name-c" >"$work/packs"
  for i in 0 1 2 3; do
    cmds=$(awk -v i=$i -v d="$name-c" 'NR % 4 == i { printf "get %s/%s /dev/null; ", d, $0 }' "$work/packs")
    smbclient -p "${host#*:}" "//${host%:*}/backup" -U "backup%$CAPSULE_TEST_SMB_PASSWORD" -c "$cmds" >/dev/null &
  done
  wait
}

rows=()
# capsule_check URL: capsule's check, its report, its peak memory.
capsule_check() {
  cold
  local s
  s=$(wall /usr/bin/time -f "%M" -o "$work/rss" "$capsule" -r "$1" --json check --read-data)
  if [ "$s" = nan ]; then echo "nan||"; return; fi
  echo "$s|$(jq -r '.report.read | "\(.bytes_per_sec / 1048576 | floor) MiB/s read, bound \(.bound)"' "$work/last.log")|$(( $(cat "$work/rss") / 1024 ))"
}

s=$(capsule_check "$work/local")
rows+=("local disk|0|${s%%|*}|$(per_sec "${s%%|*}" "$mib")|$(echo "$s" | cut -d'|' -f2)|$(echo "$s" | cut -d'|' -f3)|—|—")
for rtt in $rtts; do
  proxies "v$rtt" "$rtt"
  for dest in S3 SFTP SMB; do
    lower=$(echo "$dest" | tr 'A-Z' 'a-z')
    host=${!lower}
    s=$(capsule_check "$(capsule_url $dest "$host")")
    cold; l=$(wall "link_$lower" "$host")
    cold; r=$(wall restic_on $dest "$host" check --read-data)
    rows+=("$dest|$rtt|${s%%|*}|$(per_sec "${s%%|*}" "$mib")|$(echo "$s" | cut -d'|' -f2)|$(echo "$s" | cut -d'|' -f3)|$l s, $(per_sec "$l" "$mib")|$r s, $(per_sec "$r" "$mib")")
    echo "  $dest $rtt ms: capsule ${s%%|*} s, link $l s, restic $r s" >&2
  done
done

rm -rf "${smb_dir:?}/$name-c" "${smb_dir:?}/$name-r" "${sftp_dir:?}/$name-c" "${sftp_dir:?}/$name-r"
echo
echo "$mib MiB in 16 files; \`check --read-data\` with a cold page cache; $( [ "$pin_it" = 1 ] && echo "servers and proxy pinned to the last core" || echo "unpinned" )"
echo
echo "| destination | RTT ms | capsule s | capsule MiB/s | capsule's report | capsule peak MiB | the link (4 plain readers) | restic check --read-data |"
echo "|---|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do echo "| ${row//|/ | } |"; done
