#!/usr/bin/env bash
# What limits each destination: capsule's backups and restores to real Samba,
# OpenSSH and MinIO on loopback at each RTT (Toxiproxy), beside the link's
# ceiling measured in the same run, with the bound each run reports.
#
#   bench/limits.sh [--rtt "2 10 30"] [--small N] [--large N] [--pin]
#                   [--repeat N] [--output FILE]
#
# Data: N × 50 KiB random files (default 10,000: 500 MiB) and N × 128 MiB
# random files (default 4: 512 MiB), each backed up into a fresh repository
# and restored from it into a fresh directory with a cold cache.
# Ceiling: 8 × 64 MiB files sent 8 at once through the same proxy, the
# better of rclone (S3: multipart, 8 parts in flight per file) and a raw
# stream per file (SMB: smbclient put; SFTP: ssh cat, no SFTP protocol at
# all): about the most the link, the proxy and the server carry for bulk
# uploads here. Nothing else a backup does (reading, chunking, encrypting)
# is in it, though it shares the 2 cores with the servers and the proxy.
# Peak RSS of each capsule process comes from /usr/bin/time. A local
# repository gives the reference row.
# --pin runs the servers and Toxiproxy on the last CPU, and capsule and the
# ceiling's clients on the others (bench/lib.sh pin_servers).
# --repeat N measures each ceiling and each backup N times (each backup
# into a fresh repository) and reports medians, with every run's figure
# beside them: on this machine one row moves by about ±12 points of the
# ceiling from run to run. Restores run once, from the last backup.
# After each backup the same paths are backed up again with nothing
# changed (the hourly case), and that time is reported too.
# The bound and its evidence are what `capsule backup --json` and
# `capsule restore --json` report. Needs root for apt-get (rclone).
set -euo pipefail
cd "$(dirname "$0")/.."

rtts="2 10 30" output="" small_n=10000 large_n=4 pin_flag=0 repeat=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rtt) rtts=$2; shift ;;
    --small) small_n=$2; shift ;;
    --large) large_n=$2; shift ;;
    --pin) pin_flag=1 ;;
    --repeat) repeat=$2; shift ;;
    --output) output=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

missing=()
for p in rclone:rclone /usr/bin/time:time; do
  command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /tmp/capsule-limits.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
use_servers
[ "$pin_flag" = 1 ] && pin_servers

export CAPSULE_PASSWORD=bench
export CAPSULE_SMB_PASSWORD=$CAPSULE_TEST_SMB_PASSWORD
export CAPSULE_SFTP_KEY=$CAPSULE_TEST_SFTP_KEY
export AWS_ACCESS_KEY_ID=$CAPSULE_TEST_S3_KEY AWS_SECRET_ACCESS_KEY=$CAPSULE_TEST_S3_SECRET
smb_dir=$CAPSULE_TEST_SMB_DIR sftp_dir=$CAPSULE_TEST_SFTP_DIR
# Restores go to a journaled ext4 file system when one can be mounted: each
# restore is deleted before the next, which on this machine's disk (ext4
# without a journal) slows the next one's file creation (see scratch_disk).
scratch_disk "$work/disk" 16

python3 - "$work" "$small_n" "$large_n" <<'EOF'
import os, sys, random
work, n, big = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(11)
for i in range(n):
    d = os.path.join(work, "small", f"d{i // 500:03d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
        f.write(rnd.randbytes(50 * 1024))
os.makedirs(os.path.join(work, "large"))
for i in range(big):
    with open(os.path.join(work, "large", f"big{i}.bin"), "wb") as f:
        for _ in range(128):
            f.write(rnd.randbytes(1 << 20))
os.makedirs(os.path.join(work, "ceiling"))
for i in range(8):
    with open(os.path.join(work, "ceiling", f"c{i}.bin"), "wb") as f:
        for _ in range(64):
            f.write(rnd.randbytes(1 << 20))
EOF
sync

rows=()
declare -A local_backup=()
n=0
fresh() { n=$((n + 1)); r="${work##*.}-l$n"; }
seconds() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$@"; }

# mbs T0 T1: MB/s of the 512 MiB ceiling set between two times.
mbs() { python3 -c "import sys; print(f'{512 * 1048576 / 1e6 / (float(sys.argv[2]) - float(sys.argv[1])):.0f}')" "$@"; }

# median X...: the median of the numbers (the lower middle of an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# ceilings REMOTE PATH [RAW-CMD]: `ceiling` --repeat times, the median and
# then every run's figure, space-separated.
ceilings() {
  local k all=()
  for ((k = 1; k <= repeat; k++)); do
    # A path of its own each time: rclone skips files already there.
    all+=("$(ceiling "$1" "$2-$k" "${@:3}")")
    # The next upload must not wait for the server to write this one back.
    sync
  done
  echo "$(median "${all[@]}") ${all[*]}"
}

# ceiling REMOTE PATH [RAW-CMD]: MB/s of the 8 × 64 MiB files sent 8 at
# once, the better of rclone and, where given, RAW-CMD run once per file
# (the file on stdin, its name as $1).
ceiling() {
  local t0 t1 best=nan
  t0=$(date +%s.%N)
  # AWS_CA_BUNDLE (set on some machines) makes rclone refuse plain HTTP.
  if "${pin[@]}" env -u AWS_CA_BUNDLE rclone copy --transfers 8 --s3-upload-concurrency 8 \
    --s3-chunk-size 16M --s3-disable-checksum "$work/ceiling" "$1:$2" >"$work/rclone.log" 2>&1; then
    t1=$(date +%s.%N)
    best=$(mbs "$t0" "$t1")
  else
    tail -3 "$work/rclone.log" >&2
  fi
  if [ $# -gt 2 ]; then
    local f pids=() ok=1
    t0=$(date +%s.%N)
    for f in "$work"/ceiling/*.bin; do
      "${pin[@]}" bash -c "$3" _ "$(basename "$f")" <"$f" >/dev/null 2>>"$work/raw.log" & pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || ok=0; done
    t1=$(date +%s.%N)
    if [ "$ok" = 1 ]; then
      local raw; raw=$(mbs "$t0" "$t1")
      if [ "$best" = nan ] || [ "$raw" -gt "$best" ]; then best=$raw; fi
    else
      tail -3 "$work/raw.log" >&2
    fi
  fi
  echo "$best"
}

# run DEST RTT URL CEILING: backs up and restores both data sets.
run() {
  local dest=$1 rtt=$2 url=$3 ceils=($4) set
  local ceil=${ceils[0]}
  for set in small large; do
    local u bytes k runs=() nochange=()
    bytes=$(du -sb "$work/$set" | cut -f1)
    for ((k = 1; k <= repeat; k++)); do
      u="$url-$set-$k"
      "$capsule" -r "$u" -q init
      # Each run starts with nothing left to write back: not the ceiling's
      # gigabyte on the server's disk, nor the last restore on the target's.
      sync
      local t0 t1
      t0=$(date +%s.%N)
      /usr/bin/time -f %M -o "$work/b.rss" "${pin[@]}" "$capsule" -r "$u" backup --json "$work/$set" >"$work/b.json"
      t1=$(date +%s.%N)
      runs+=("$(seconds "$t0" "$t1")")
      # The hourly case: the same paths again, nothing changed. What is
      # left is opening the repository and a few round trips.
      t0=$(date +%s.%N)
      "${pin[@]}" "$capsule" -r "$u" -q backup "$work/$set"
      t1=$(date +%s.%N)
      nochange+=("$(seconds "$t0" "$t1")")
      # Only the last repository is restored from; a local one is in the way.
      if [ "$k" -lt "$repeat" ] && [ "$dest" = local ]; then rm -rf "$u"; fi
    done
    local bs ns; bs=$(median "${runs[@]}") ns=$(median "${nochange[@]}")
    [ "$dest" = local ] && local_backup[$set]=$bs
    sync
    t0=$(date +%s.%N)
    /usr/bin/time -f %M -o "$work/r.rss" \
      "${pin[@]}" "$capsule" -r "$u" --no-cache restore --json latest --target "$work/disk/out" >"$work/r.json"
    t1=$(date +%s.%N)
    local rs; rs=$(seconds "$t0" "$t1")
    diff -rq "$work/$set" "$work/disk/out$work/$set" >/dev/null || { echo "restore of $set from $dest differs" >&2; exit 1; }
    rm -rf "$work/disk/out"
    rows+=("$(python3 - "$work/b.json" "$work/r.json" "$dest" "$rtt" "$set" "$bytes" "$bs" "$rs" "$ceil" \
      "$(($(cat "$work/b.rss") / 1024))" "$(($(cat "$work/r.rss") / 1024))" "${local_backup[$set]}" \
      "${ceils[*]:1}" "${runs[*]}" "$ns" "${nochange[*]}" <<'EOF'
import json, sys
b, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
dest, rtt, dset, nbytes, bs, rs, ceil, brss, rrss, lbs, ceil_runs, backup_runs, ns, ns_runs = sys.argv[3:]
nbytes, bs, rs = int(nbytes), float(bs), float(rs)
bb = b.get("bound") or {}
f = r.get("fetch") or {}
rb = f.get("bound") or {}
def first(e): return e[0] if isinstance(e, list) and e else e
def mbs(s): return nbytes / 1e6 / max(s, 1e-9)
pct = "—" if ceil == "nan" else f"{100 * mbs(bs) / float(ceil):.0f}%"
# With --repeat, every run beside the median: each backup's share of the
# median ceiling, and each ceiling.
if len(backup_runs.split()) > 1:
    bs_txt = f"{bs:.2f} ({', '.join(backup_runs.split())})"
    if ceil != "nan":
        pct += " (" + ", ".join(f"{100 * mbs(float(x)) / float(ceil):.0f}" for x in backup_runs.split()) + ")"
        ceil = f"{ceil} ({', '.join(ceil_runs.split())})"
else:
    bs_txt = f"{bs:.2f}"
ns_txt = f"{float(ns):.2f}" + (f" ({', '.join(ns_runs.split())})" if len(ns_runs.split()) > 1 else "")
# The backup's speed against the same backup to the local disk: where that
# is below the ceiling, the client's CPU, not the link, is the limit.
of_local = "—" if dest == "local" else f"{100 * float(lbs) / max(bs, 1e-9):.0f}%"
print(f"| {dest} | {rtt} | {dset} | {'—' if ceil == 'nan' else ceil} | {bs_txt} | {mbs(bs):.0f} | {pct} | {of_local} | {ns_txt} | {brss} | "
      f"{bb.get('kind', '?')}: {first(bb.get('evidence', ''))} | {rs:.2f} | {mbs(rs):.0f} | {rrss} | "
      f"{rb.get('kind', '?')}: {rb.get('evidence', '')} |")
EOF
)")
    echo "${rows[-1]}" >&2
  done
}

# The reference: a repository on this disk.
fresh; run local 0 "$work/$r" nan
rm -rf "${work:?}/$r"-*

for rtt in $rtts; do
  proxies "lim-$rtt" "$rtt"
  export RCLONE_CONFIG_NAS_TYPE=smb RCLONE_CONFIG_NAS_HOST=${smb%:*} RCLONE_CONFIG_NAS_PORT=${smb#*:} \
    RCLONE_CONFIG_NAS_USER=backup RCLONE_CONFIG_NAS_PASS=$(rclone obscure "$CAPSULE_TEST_SMB_PASSWORD")
  export RCLONE_CONFIG_SSH_TYPE=sftp RCLONE_CONFIG_SSH_HOST=${sftp%:*} RCLONE_CONFIG_SSH_PORT=${sftp#*:} \
    RCLONE_CONFIG_SSH_USER=root RCLONE_CONFIG_SSH_KEY_FILE=$CAPSULE_TEST_SFTP_KEY
  export RCLONE_CONFIG_OBJ_TYPE=s3 RCLONE_CONFIG_OBJ_PROVIDER=Minio RCLONE_CONFIG_OBJ_ENDPOINT=http://$s3 \
    RCLONE_CONFIG_OBJ_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID RCLONE_CONFIG_OBJ_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY

  fresh; mkdir -p "$smb_dir/$r"
  c=$(ceilings nas "backup/$r/ceiling" \
    "smbclient -p ${smb#*:} //${smb%:*}/backup -U backup%$CAPSULE_TEST_SMB_PASSWORD -c \"put /dev/stdin $r/raw-\$1\"")
  rm -rf "${smb_dir:?}/$r"/ceiling-* "${smb_dir:?}/$r"/raw-*
  run SMB "$rtt" "smb://backup@$smb/backup/$r" "$c"
  rm -rf "${smb_dir:?}/$r" "${smb_dir:?}/$r"-*

  fresh; mkdir -p "$sftp_dir/$r"
  c=$(ceilings ssh "$sftp_dir/$r/ceiling" \
    "ssh -i $CAPSULE_TEST_SFTP_KEY -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -p ${sftp#*:} root@${sftp%:*} 'cat > /dev/null'")
  rm -rf "${sftp_dir:?}/$r"/ceiling-*
  run SFTP "$rtt" "sftp://root@$sftp$sftp_dir/$r" "$c"
  rm -rf "${sftp_dir:?}/$r" "${sftp_dir:?}/$r"-*

  fresh
  c=$(ceilings obj "capsule-test/$r/ceiling")
  run S3 "$rtt" "s3+http://$s3/capsule-test/$r" "$c"
  # Ceilings and repositories: a gigabyte or more each, at every RTT.
  env -u AWS_CA_BUNDLE rclone purge "obj:capsule-test/$r" >/dev/null 2>&1 || true
  for k in $(seq "$repeat"); do
    for set in small large; do
      env -u AWS_CA_BUNDLE rclone purge "obj:capsule-test/$r-$set-$k" >/dev/null 2>&1 || true
    done
  done
done

{
  echo "Machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; servers on loopback; RTT added by Toxiproxy."
  if [ "$pinned" = 1 ]; then
    echo "Pinned: the servers and Toxiproxy on CPU $(($(nproc) - 1)); capsule and the ceiling's clients on CPU ${pin[2]}."
  fi
  echo "Versions: $("$capsule" --version); $(rclone version | head -1)"
  echo "Data: small = $small_n × 50 KiB, large = $large_n × 128 MiB. Ceiling: 8 × 64 MiB sent 8 at once, the better of rclone and (SMB) smbclient put or (SFTP) ssh cat."
  echo "Restore targets: $([ "$scratch_journaled" = 1 ] && echo "a journaled ext4 file system on a loop device (direct I/O)" || echo "this machine's disk")."
  echo
  echo "| destination | RTT ms | data | ceiling MB/s | backup s | MB/s | of ceiling | of local | no-change run s | backup peak RSS MiB | backup bound | restore s | MB/s | restore peak RSS MiB | restore bound |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|"
  printf '%s\n' "${rows[@]}"
} | tee "${output:-/dev/null}"
