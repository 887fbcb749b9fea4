#!/usr/bin/env bash
# Network destinations benchmark: capsule against restic, borg and per-file
# copying on real Samba, OpenSSH and MinIO servers on loopback, at 0 ms and
# at 2 ms round trip (Toxiproxy), all in one run. Prints Markdown tables.
#
#   bench/net.sh [--toolchain] [--rtt "0 2"] [--output FILE]
#
# Workloads:
#   small      10,000 × 50 KiB files, initial backup (files/s)
#   toolchain  ~/.rustup/toolchains (with --toolchain): initial backup and a
#              no-change run, beside capsule's own local-disk times
#   *-restore  capsule's full restore of each, cold cache, fresh directory,
#              checked against the source (bench/restore.sh has the peers)
# Tools per destination:
#   SMB   capsule, restic via rclone:, smbclient mput (per file)
#   SFTP  capsule, restic (sftp:), borg (ssh://), rsync over ssh (per file)
#   S3    capsule, restic (s3:)
# Needs root (apt-get for restic, borgbackup, rclone, smbclient, rsync).
set -euo pipefail
cd "$(dirname "$0")/.."

toolchain=0 rtts="0 2" output="" small_n=10000
while [ $# -gt 0 ]; do
  case "$1" in
    --toolchain) toolchain=1 ;;
    --rtt) rtts=$2; shift ;;
    --small) small_n=$2; shift ;;
    --output) output=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

missing=()
for p in restic:restic borg:borgbackup rclone:rclone smbclient:smbclient rsync:rsync; do
  command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /tmp/capsule-netbench.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
use_servers

export CAPSULE_PASSWORD=bench RESTIC_PASSWORD=bench BORG_PASSPHRASE=bench
export CAPSULE_SMB_PASSWORD=$CAPSULE_TEST_SMB_PASSWORD
export CAPSULE_SFTP_KEY=$CAPSULE_TEST_SFTP_KEY
export AWS_ACCESS_KEY_ID=$CAPSULE_TEST_S3_KEY AWS_SECRET_ACCESS_KEY=$CAPSULE_TEST_S3_SECRET
export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
ssh_opts="-i $CAPSULE_TEST_SFTP_KEY -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
smb_dir=$CAPSULE_TEST_SMB_DIR sftp_dir=$CAPSULE_TEST_SFTP_DIR

echo "generating data in $work" >&2
python3 - "$work/small" "$small_n" <<'EOF'
import os, sys, random
root, n = sys.argv[1], int(sys.argv[2])
rnd = random.Random(7)
for i in range(n):
    d = os.path.join(root, f"d{i // 500:03d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
        f.write(rnd.randbytes(50 * 1024))
EOF
if [ "$toolchain" = 1 ]; then
  cp -a "$HOME/.rustup/toolchains" "$work/toolchain"
fi
# Write the generated data out now: gigabytes of dirty pages flushed in the
# background would slow whichever runs come first.
sync
sleep 2 # let ctimes age past capsule's one-second re-read window

# timed LABEL CMD... : runs CMD, records wall seconds in $last
last=0
timed() {
  local t0 t1
  t0=$(date +%s.%N)
  if ! "$@" >"$work/last.log" 2>&1; then
    echo "  FAILED: $*" >&2
    tail -5 "$work/last.log" >&2
    last=nan
    return 0
  fi
  t1=$(date +%s.%N)
  last=$(python3 -c "print(f'{$t1 - $t0:.2f}')")
}

rows=()
record() { rows+=("$1|$2|$3|$4|$5|$6"); echo "  $1 $2 $3 $4: $5 s" >&2; }

n=0
# Names unique to this run: a reused MinIO keeps earlier runs' prefixes.
fresh() { n=$((n + 1)); r="${work##*.}-r$n"; }

# restored URL LABEL DEST RTT FILES: a full restore with a cold cache into a
# fresh directory on the same disk, checked against the source.
restored() {
  rm -rf "$work/out"
  timed "$capsule" -r "$1" --no-cache -q restore latest --target "$work/out"
  record "$2-restore" "$3" "$4" capsule "$last" "$5"
  if [ "$last" != nan ] && ! diff -rq "$data" "$work/out$data" >/dev/null; then
    echo "  restore from $3 at $4 ms differs from the source" >&2
    exit 1
  fi
  rm -rf "$work/out"
}

capsule_run() { # url data
  "$capsule" -r "$1" -q init && "$capsule" -r "$1" -q backup "$2"
}

run_dataset() { # label dir files
  local label=$1 data=$2 files=$3
  # capsule on the local disk: the reference for the targets.
  local r; fresh
  timed "$capsule" -r "$work/local-$r" -q init
  timed "$capsule" -r "$work/local-$r" -q backup "$data"; record "$label" local 0 capsule "$last" "$files"
  timed "$capsule" -r "$work/local-$r" -q backup "$data"; record "$label-nochange" local 0 capsule "$last" "$files"
  restored "$work/local-$r" "$label" local 0 "$files"
  rm -rf "$work/local-$r"
  for rtt in $rtts; do
    local smb sftp s3
    proxies "$label-$rtt" "$rtt"

    # SMB
    fresh; local u="smb://backup@$smb/backup/$r"
    mkdir -p "$smb_dir/$r"; "$capsule" -r "$u" -q init
    timed "$capsule" -r "$u" -q backup "$data"; record "$label" SMB "$rtt" capsule "$last" "$files"
    timed "$capsule" -r "$u" -q backup "$data"; record "$label-nochange" SMB "$rtt" capsule "$last" "$files"
    restored "$u" "$label" SMB "$rtt" "$files"
    rm -rf "${smb_dir:?}/$r"
    fresh; mkdir -p "$smb_dir/$r"
    export RCLONE_CONFIG_NAS_TYPE=smb RCLONE_CONFIG_NAS_HOST=${smb%:*} RCLONE_CONFIG_NAS_PORT=${smb#*:} \
      RCLONE_CONFIG_NAS_USER=backup RCLONE_CONFIG_NAS_PASS=$(rclone obscure "$CAPSULE_TEST_SMB_PASSWORD")
    restic -r "rclone:nas:backup/$r" init -q >/dev/null 2>&1
    timed restic -r "rclone:nas:backup/$r" backup -q "$data"; record "$label" SMB "$rtt" "restic (rclone)" "$last" "$files"
    rm -rf "${smb_dir:?}/$r"
    if [ "$label" = small ]; then
      fresh; mkdir -p "$smb_dir/$r"
      timed smbclient -p "${smb#*:}" "//${smb%:*}/backup" -U "backup%$CAPSULE_TEST_SMB_PASSWORD" \
        -c "prompt OFF; recurse ON; cd $r; lcd $data; mput *"
      record "$label" SMB "$rtt" "smbclient mput (per file)" "$last" "$files"
      rm -rf "${smb_dir:?}/$r"
    fi

    # SFTP
    fresh; u="sftp://root@$sftp$sftp_dir/$r"
    mkdir -p "$sftp_dir/$r"; "$capsule" -r "$u" -q init
    timed "$capsule" -r "$u" -q backup "$data"; record "$label" SFTP "$rtt" capsule "$last" "$files"
    timed "$capsule" -r "$u" -q backup "$data"; record "$label-nochange" SFTP "$rtt" capsule "$last" "$files"
    restored "$u" "$label" SFTP "$rtt" "$files"
    rm -rf "${sftp_dir:?}/$r"
    fresh
    restic -o sftp.command="ssh $ssh_opts -p ${sftp#*:} root@${sftp%:*} -s sftp" -r "sftp:root@${sftp%:*}:$sftp_dir/$r" init -q >/dev/null 2>&1
    timed restic -o sftp.command="ssh $ssh_opts -p ${sftp#*:} root@${sftp%:*} -s sftp" -r "sftp:root@${sftp%:*}:$sftp_dir/$r" backup -q "$data"
    record "$label" SFTP "$rtt" restic "$last" "$files"
    timed restic -o sftp.command="ssh $ssh_opts -p ${sftp#*:} root@${sftp%:*} -s sftp" -r "sftp:root@${sftp%:*}:$sftp_dir/$r" backup -q "$data"
    record "$label-nochange" SFTP "$rtt" restic "$last" "$files"
    rm -rf "${sftp_dir:?}/$r"
    fresh
    export BORG_RSH="ssh $ssh_opts"
    borg init -e repokey-blake2 "ssh://root@$sftp$sftp_dir/$r" 2>/dev/null
    timed borg create "ssh://root@$sftp$sftp_dir/$r::a" "$data"; record "$label" SFTP "$rtt" "borg (ssh)" "$last" "$files"
    timed borg create "ssh://root@$sftp$sftp_dir/$r::b" "$data"; record "$label-nochange" SFTP "$rtt" "borg (ssh)" "$last" "$files"
    rm -rf "${sftp_dir:?}/$r"
    fresh
    timed rsync -a -e "ssh $ssh_opts -p ${sftp#*:}" "$data/" "root@${sftp%:*}:$sftp_dir/$r/"
    record "$label" SFTP "$rtt" "rsync over ssh (per file)" "$last" "$files"
    rm -rf "${sftp_dir:?}/$r"

    # S3
    fresh; u="s3+http://$s3/capsule-test/$r"
    "$capsule" -r "$u" -q init
    timed "$capsule" -r "$u" -q backup "$data"; record "$label" S3 "$rtt" capsule "$last" "$files"
    timed "$capsule" -r "$u" -q backup "$data"; record "$label-nochange" S3 "$rtt" capsule "$last" "$files"
    restored "$u" "$label" S3 "$rtt" "$files"
    if [ "$label" = small ]; then
      # Over plain HTTP the payload is signed (SHA-256 on both ends); HTTPS
      # endpoints skip that. This row shows what the signing costs here.
      fresh; u="s3+http://$s3/capsule-test/$r"
      "$capsule" -r "$u" -q init
      AWS_UNSIGNED_PAYLOAD=true timed "$capsule" -r "$u" -q backup "$data"
      record "$label" S3 "$rtt" "capsule (unsigned payload)" "$last" "$files"
    fi
    fresh
    restic -r "s3:http://$s3/capsule-test/$r" init -q >/dev/null 2>&1
    timed restic -r "s3:http://$s3/capsule-test/$r" backup -q "$data"; record "$label" S3 "$rtt" restic "$last" "$files"
    timed restic -r "s3:http://$s3/capsule-test/$r" backup -q "$data"; record "$label-nochange" S3 "$rtt" restic "$last" "$files"
  done
}

run_dataset small "$work/small" "$small_n"
if [ "$toolchain" = 1 ]; then
  tc_files=$(find "$work/toolchain" -type f | wc -l)
  run_dataset toolchain "$work/toolchain" "$tc_files"
fi

{
  echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; servers on loopback; RTT added by Toxiproxy."
  echo "Versions: $("$capsule" --version); $(restic version | head -1); $(borg --version); $(rclone version | head -1); $(smbclient --version); $(rsync --version | head -1)"
  echo
  echo "| workload | destination | RTT ms | tool | wall s | files/s |"
  echo "|---|---|---:|---|---:|---:|"
  for row in "${rows[@]}"; do
    IFS='|' read -r w d rtt tool wall files <<<"$row"
    rate=$(python3 -c "w='$wall'; print('—' if w=='nan' else f'{$files/max(float(w),1e-9):,.0f}')")
    echo "| $w | $d | $rtt | $tool | $wall | $rate |"
  done
} | tee "${output:-/dev/null}"
