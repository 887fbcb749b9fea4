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
missing=()
for p in restic:restic rclone:rclone jq:jq; do
  command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /tmp/capsule-copybench.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
use_servers
if [ "$pin_it" = 1 ]; then pin_servers; taskset -cp "${pin[2]}" $$ >/dev/null; fi

export CAPSULE_PASSWORD=bench RESTIC_PASSWORD=bench RESTIC_FROM_PASSWORD=bench
export CAPSULE_SMB_PASSWORD=$CAPSULE_TEST_SMB_PASSWORD
export CAPSULE_SFTP_KEY=$CAPSULE_TEST_SFTP_KEY
export AWS_ACCESS_KEY_ID=$CAPSULE_TEST_S3_KEY AWS_SECRET_ACCESS_KEY=$CAPSULE_TEST_S3_SECRET
export CAPSULE_SFTP_KNOWN_HOSTS=$CAPSULE_TEST_KNOWN_HOSTS
ssh_opts="-i $CAPSULE_TEST_SFTP_KEY -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
smb_dir=$CAPSULE_TEST_SMB_DIR sftp_dir=$CAPSULE_TEST_SFTP_DIR
name=${work##*.}

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

cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }
secs() {
  local t0 t1
  t0=$(date +%s.%N)
  if ! "$@" >"$work/last.log" 2>"$work/last.err"; then
    echo "  FAILED: $*" >&2; tail -3 "$work/last.err" >&2
    echo nan; return 0
  fi
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}
rate() { python3 -c "s='$1'; print('failed' if s == 'nan' else f'{$2 / float(s):.0f} MiB/s')"; }

# The source repositories, written once without the proxy.
up_url() {
  case $1 in
    S3) echo "s3+http://$CAPSULE_TEST_S3_UPSTREAM/capsule-test/$name-c" ;;
    SFTP) echo "sftp://root@$CAPSULE_TEST_SFTP_UPSTREAM$sftp_dir/$name-c" ;;
    SMB) echo "smb://backup@$CAPSULE_TEST_SMB_UPSTREAM/backup/$name-c" ;;
  esac
}
mkdir -p "$smb_dir/$name-c" "$smb_dir/$name-r" "$sftp_dir/$name-c"
restic_s3() { restic -r "s3:http://$1/capsule-test/$name-r" "${@:2}"; }
restic_sftp() { restic -o sftp.command="ssh $ssh_opts -p ${1#*:} root@${1%:*} -s sftp" -r "sftp:root@${1%:*}:$sftp_dir/$name-r" "${@:2}"; }
restic_smb() {
  RCLONE_CONFIG_NAS_TYPE=smb RCLONE_CONFIG_NAS_HOST=${1%:*} RCLONE_CONFIG_NAS_PORT=${1#*:} \
    RCLONE_CONFIG_NAS_USER=backup RCLONE_CONFIG_NAS_PASS=$(rclone obscure "$CAPSULE_TEST_SMB_PASSWORD") \
    restic "${@:2}"
}
restic_src() { # DEST HOST: the source repository option for restic copy
  case $1 in
    S3) echo "s3:http://$2/capsule-test/$name-r" ;;
    SFTP) echo "sftp:root@${2%:*}:$sftp_dir/$name-r" ;;
    SMB) echo "rclone:nas:backup/$name-r" ;;
  esac
}
for dest in S3 SFTP SMB; do
  "$capsule" -r "$(up_url $dest)" -q init
  "$capsule" -r "$(up_url $dest)" -q backup "$work/data"
done
restic_s3 "$CAPSULE_TEST_S3_UPSTREAM" init -q >/dev/null && restic_s3 "$CAPSULE_TEST_S3_UPSTREAM" backup -q "$work/data" >/dev/null
restic_sftp "$CAPSULE_TEST_SFTP_UPSTREAM" init -q >/dev/null && restic_sftp "$CAPSULE_TEST_SFTP_UPSTREAM" backup -q "$work/data" >/dev/null
restic_smb "$CAPSULE_TEST_SMB_UPSTREAM" -r "rclone:nas:backup/$name-r" init -q >/dev/null
restic_smb "$CAPSULE_TEST_SMB_UPSTREAM" -r "rclone:nas:backup/$name-r" backup -q "$work/data" >/dev/null

rows=()
for rtt in $rtts; do
  smb=$(proxy "smb-c$rtt" "$CAPSULE_TEST_SMB_UPSTREAM" "$rtt")
  sftp=$(proxy "sftp-c$rtt" "$CAPSULE_TEST_SFTP_UPSTREAM" "$rtt")
  s3=$(proxy "s3-c$rtt" "$CAPSULE_TEST_S3_UPSTREAM" "$rtt")
  kh="$work/kh-$rtt"
  printf '[%s]:%s %s\n' "${sftp%:*}" "${sftp#*:}" "$(cut -d' ' -f1,2 "$servers/ssh/host_key.pub")" >"$kh"
  export CAPSULE_SFTP_KNOWN_HOSTS=$kh
  for dest in S3 SFTP SMB; do
    case $dest in
      S3) url="s3+http://$s3/capsule-test/$name-c" host=$s3 ;;
      SFTP) url="sftp://root@$sftp$sftp_dir/$name-c" host=$sftp ;;
      SMB) url="smb://backup@$smb/backup/$name-c" host=$smb ;;
    esac
    lower=$(echo "$dest" | tr 'A-Z' 'a-z')
    rm -rf "$work/out" "$work/same" "$work/own" "$work/restic-local"
    cold; restored=$(secs "$capsule" -r "$url" -q --no-cache restore latest --target "$work/out")
    rm -rf "$work/out"
    "$capsule" -r "$work/same" -q init --copy-chunker-params-from "$url"
    cold; same=$(secs "$capsule" -r "$url" -q --no-cache copy --to "$work/same")
    "$capsule" -r "$work/own" -q init
    cold; own=$(secs "$capsule" -r "$url" -q --no-cache copy --to "$work/own")
    # Both copies must hold the same files as the source.
    for t in same own; do
      "$capsule" -r "$work/$t" -q restore latest --target "$work/check-$t"
      diff -rq "$work/data" "$work/check-$t$work/data" >/dev/null || { echo "copy to $t differs from the source" >&2; exit 1; }
      rm -rf "$work/check-$t"
    done
    restic -r "$work/restic-local" init -q >/dev/null
    cold; r=$(secs "restic_$lower" "$host" -r "$work/restic-local" copy --from-repo "$(restic_src $dest "$host")")
    rows+=("$dest|$rtt|$restored s, $(rate "$restored" "$total")|$same s, $(rate "$same" "$total")|$own s, $(rate "$own" "$total")|$r s, $(rate "$r" "$total")")
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
