#!/usr/bin/env bash
# Restore benchmark: capsule against restic, borg and rsync, restoring the
# same data from the same real servers (Samba, OpenSSH, MinIO on loopback)
# at each RTT (Toxiproxy), all in one run. Prints a Markdown table.
#
#   bench/restore.sh [--rtt "2 10"] [--small N] [--big MIB] [--toolchain]
#                    [--tree DIR] [--pin] [--output FILE]
#
# Data: N × 64 KiB random files plus one file of MIB MiB (defaults 4,000 and
# 200: 450 MiB), or with --toolchain ~/.rustup/toolchains, or any DIR.
# Peers: restic from Debian (0.14) and the newest restic the Go module proxy
# serves (built once into ~/.cache/capsule-bench), rustic when it is
# installed (on PATH or where `capsule-bench --install` puts it), borg and
# rsync.
# Every restore goes into a fresh directory with a cold capsule cache
# (`--no-cache`), so tree packs are fetched too, as on a new laptop. The
# directories lie on a journaled ext4 file system mounted for the run and
# are deleted once checked; without root they lie on this disk and are
# kept until the run ends (see settle()), which needs room for about 30
# times the data. Wall
# time, MB/s and peak RSS come from GNU time; capsule's requests and bytes
# fetched from its --json report.
# --pin runs the servers and Toxiproxy on the last CPU and every measured
# restore, local ones too, on the others (bench/lib.sh pin_servers).
# Needs root (apt-get for restic, borgbackup, rclone, rsync).
set -euo pipefail
cd "$(dirname "$0")/.."

rtts="2 10" output="" small_n=4000 big_mib=200 toolchain=0 tree="" pin_flag=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rtt) rtts=$2; shift ;;
    --small) small_n=$2; shift ;;
    --big) big_mib=$2; shift ;;
    --toolchain) toolchain=1 ;;
    --tree) tree=$2; shift ;;
    --pin) pin_flag=1 ;;
    --output) output=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

missing=()
for p in restic:restic borg:borgbackup rclone:rclone rsync:rsync /usr/bin/time:time; do
  command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule

# The newest restic: known releases, newest first. Not `@latest`: here it
# resolves to v0.10.0, older than Debian's. The checksum database cannot be
# reached from these machines, so it is not consulted (GOSUMDB=off); the
# module comes from the Go module proxy either way.
cache=$HOME/.cache/capsule-bench
restic_new=""
export GOSUMDB=off GOFLAGS=-mod=mod
if command -v go >/dev/null; then
  for v in v0.19.1 v0.19.0 v0.18.1 v0.18.0 v0.17.3; do
    dir=$(go mod download -json "github.com/restic/restic@$v" 2>/dev/null |
      python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir",""), d.get("Version",""))' 2>/dev/null) || continue
    read -r dir ver <<<"$dir"
    [ -n "$dir" ] || continue
    if [ ! -x "$cache/restic-$ver" ]; then
      mkdir -p "$cache"
      (cd "$dir" && go build -o "$cache/restic-$ver" ./cmd/restic) >&2 || continue
    fi
    restic_new=$cache/restic-$ver
    break
  done
fi
[ -n "$restic_new" ] || echo "no newer restic could be built; its rows are left out" >&2
rustic=""
for c in "${RUSTIC:-}" "$(command -v rustic || true)" "$cache/bin/rustic"; do
  if [ -n "$c" ] && [ -x "$c" ]; then rustic=$c; break; fi
done
[ -n "$rustic" ] || echo "rustic not installed (capsule-bench --install builds it); its rows are left out" >&2
work=$(mktemp -d /tmp/capsule-restorebench.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
use_servers
[ "$pin_flag" = 1 ] && pin_servers

export CAPSULE_PASSWORD=bench RESTIC_PASSWORD=bench BORG_PASSPHRASE=bench RUSTIC_PASSWORD=bench
export CAPSULE_SMB_PASSWORD=$CAPSULE_TEST_SMB_PASSWORD
export CAPSULE_SFTP_KEY=$CAPSULE_TEST_SFTP_KEY
export AWS_ACCESS_KEY_ID=$CAPSULE_TEST_S3_KEY AWS_SECRET_ACCESS_KEY=$CAPSULE_TEST_S3_SECRET
export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
ssh_opts="-i $CAPSULE_TEST_SFTP_KEY -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
export BORG_RSH="ssh $ssh_opts"
smb_dir=$CAPSULE_TEST_SMB_DIR sftp_dir=$CAPSULE_TEST_SFTP_DIR

data=$work/data
if [ -n "$tree" ]; then
  cp -a "$tree" "$data"
elif [ "$toolchain" = 1 ]; then
  cp -a "$HOME/.rustup/toolchains" "$data"
else
  python3 - "$data" "$small_n" "$big_mib" <<'EOF'
import os, sys, random
root, n, big = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(7)
for i in range(n):
    d = os.path.join(root, f"d{i // 500:03d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05d}.bin"), "wb") as f:
        f.write(rnd.randbytes(64 * 1024))
with open(os.path.join(root, "big.bin"), "wb") as f:
    for _ in range(big):
        f.write(rnd.randbytes(1 << 20))
EOF
fi
files=$(find "$data" -type f | wc -l)
bytes=$(du -sb "$data" | cut -f1)
sync

rows=()
n=0
# Many-file trees (restored outputs, rsync's plain copy on the SFTP
# server), deleted when the run ends. On a failure, $work goes at exit and
# a plain copy on servers given by CAPSULE_TEST_SERVERS stays behind.
doomed=()

# Restores go to a journaled ext4 file system when one can be mounted
# (bench/lib.sh scratch_disk explains why), and each restored tree is
# deleted once checked. Otherwise they go to this disk, and settle() keeps
# them all.
scratch_disk "$work/disk" $(( bytes * 8 / (1 << 30) + 16 ))

# settle: without the scratch file system, waits until files deleted before
# the run no longer slow the creation of new ones. On ext4 without a
# journal (this machine's root) the inode allocator skips inodes deleted
# within the last 60 s, or 6 minutes while their inode table block is dirty
# (and creating files dirties it), and reads the table for each one it
# passes: a restore of 52,000 files right after another was deleted took
# 2.5× as long, with 5× the system time. So then nothing with many files is
# deleted during the run (a repository is a few hundred files), and the run
# starts after six quiet minutes.
settle() {
  [ "$scratch_journaled" = 1 ] || { sync; sleep 370; }
}
settle
fresh() { n=$((n + 1)); r="${work##*.}-r$n"; out=$work/disk/out-$n; }

# measure DEST RTT TOOL CMD...: restores with CMD into $out, checks the
# result against the source, records wall, MB/s, peak RSS and $extra.
extra=""
measure() {
  local dest=$1 rtt=$2 tool=$3; shift 3
  mkdir -p "$out"
  # What the backup just wrote goes to the disk now, for every tool alike.
  sync
  if ! /usr/bin/time -f "%e %M" -o "$work/time" "${pin[@]}" "$@" >"$work/last.log" 2>&1; then
    echo "  FAILED: $tool $dest $rtt" >&2; tail -5 "$work/last.log" >&2
    rows+=("$dest|$rtt|$tool|failed|—|—|—"); doomed+=("$out"); return 0
  fi
  local wall rss
  read -r wall rss <"$work/time"
  # Every tool restores the absolute source path below its target.
  local got; got=$(find "$out" -type d -path "*${data}" | head -1)
  if [ -z "$got" ] || ! diff -rq "$data" "$got" >/dev/null; then
    echo "  WRONG OUTPUT: $tool $dest $rtt" >&2
    rows+=("$dest|$rtt|$tool|wrong output|—|—|—"); doomed+=("$out"); return 0
  fi
  local mbs; mbs=$(python3 -c "print(f'{$bytes / 1e6 / max($wall, 1e-9):.0f}')")
  rows+=("$dest|$rtt|$tool|$wall|$mbs|$((rss / 1024))|$extra")
  echo "  $dest $rtt ms $tool: $wall s, $mbs MB/s, $((rss / 1024)) MiB" >&2
  if [ "$scratch_journaled" = 1 ]; then rm -rf "$out"; else doomed+=("$out"); fi
  extra=""
}

# capsule_restore DEST RTT URL: backup, then a cold restore with --json.
capsule_restore() {
  "$capsule" -r "$3" -q init && "$capsule" -r "$3" -q backup "$data"
  fresh
  measure "$1" "$2" capsule "$capsule" -r "$3" --no-cache --json restore latest -t "$out"
  extra=$(python3 - "$work/last.log" <<'EOF' || true
import json, sys
s = open(sys.argv[1]).read()
f = json.JSONDecoder().raw_decode(s[s.index("{"):])[0]["fetch"]
print(f"{f['requests']} requests, {f['bytes_fetched'] / f['bytes_needed']:.2f}× fetched/needed")
EOF
)
  # measure() cleared $extra before this; put it on the row just added.
  [ -n "$extra" ] && rows[-1]="${rows[-1]}$extra"
  extra=""
}

restic_restore() { # DEST RTT REPO [restic args...]: Debian's, then the newest
  local dest=$1 rtt=$2 repo=$3; shift 3
  restic "$@" -r "$repo" init -q >/dev/null 2>&1
  restic "$@" -r "$repo" backup -q "$data" >/dev/null
  fresh
  measure "$dest" "$rtt" "restic $(restic version | cut -d' ' -f2)" restic "$@" -r "$repo" restore latest -q --target "$out"
  if [ -n "$restic_new" ]; then
    # A repository of its own, so that neither restores what the other wrote.
    local repo2=$repo-new
    "$restic_new" "$@" -r "$repo2" init -q >/dev/null 2>&1
    "$restic_new" "$@" -r "$repo2" backup -q "$data" >/dev/null
    fresh
    measure "$dest" "$rtt" "restic $("$restic_new" version | cut -d' ' -f2)" \
      "$restic_new" "$@" -r "$repo2" restore latest -q --target "$out"
  fi
}

# rustic_restore DEST RTT [OPENDAL-SCHEME KEY=VALUE...]: a local repository,
# or one through OpenDAL described by a profile in $work.
rustic_restore() {
  [ -n "$rustic" ] || return 0
  local dest=$1 rtt=$2; shift 2
  local args=()
  if [ $# -eq 0 ]; then
    args=(-r "$work/rustic-$r")
  else
    {
      echo "[repository]"
      echo "repository = \"opendal:$1\""
      echo "[repository.options]"
      shift
      for kv in "$@"; do echo "${kv%%=*} = \"${kv#*=}\""; done
    } >"$work/rustic-$r.toml"
    args=(-P "$work/rustic-$r")
  fi
  "$rustic" "${args[@]}" init >/dev/null 2>&1 || true
  "$rustic" "${args[@]}" backup "$data" >/dev/null 2>&1 || true
  local prof=("${args[@]}")
  fresh
  measure "$dest" "$rtt" rustic "$rustic" "${prof[@]}" restore latest "$out"
}

# Local disk: the reference.
fresh; capsule_restore local 0 "$work/capsule-local"
restic_restore local 0 "$work/restic-local"
fresh; rustic_restore local 0
fresh; borg init -e repokey-blake2 "$work/borg-local" 2>/dev/null; borg create "$work/borg-local::a" "$data"
fresh; measure local 0 borg sh -c "cd '$out' && borg extract '$work/borg-local::a'"
rm -rf "$work"/capsule-local "$work"/restic-local* "$work"/borg-local "$work"/rustic-*

for rtt in $rtts; do
  proxies "restore-$rtt" "$rtt"
  # SMB
  # Each *_restore calls fresh() again before it restores, so the
  # repository's name is kept for its deletion.
  fresh; repo_dir=$smb_dir/$r; mkdir -p "$repo_dir"; capsule_restore SMB "$rtt" "smb://backup@$smb/backup/$r"
  rm -rf "${repo_dir:?}"
  export RCLONE_CONFIG_NAS_TYPE=smb RCLONE_CONFIG_NAS_HOST=${smb%:*} RCLONE_CONFIG_NAS_PORT=${smb#*:} \
    RCLONE_CONFIG_NAS_USER=backup RCLONE_CONFIG_NAS_PASS=$(rclone obscure "$CAPSULE_TEST_SMB_PASSWORD")
  fresh; repo_dir=$smb_dir/$r; mkdir -p "$repo_dir"; before=${#rows[@]}
  restic_restore SMB "$rtt" "rclone:nas:backup/$r"
  for ((i = before; i < ${#rows[@]}; i++)); do rows[i]=${rows[i]/|restic /|restic (rclone) }; done
  rm -rf "${repo_dir:?}" "$repo_dir-new"
  # SFTP
  fresh; repo_dir=$sftp_dir/$r; capsule_restore SFTP "$rtt" "sftp://root@$sftp$sftp_dir/$r"
  rm -rf "${repo_dir:?}"
  fresh; repo_dir=$sftp_dir/$r; restic_restore SFTP "$rtt" "sftp:root@${sftp%:*}:$sftp_dir/$r" \
    -o sftp.command="ssh $ssh_opts -p ${sftp#*:} root@${sftp%:*} -s sftp"
  rm -rf "${repo_dir:?}" "$repo_dir-new"
  fresh; borg init -e repokey-blake2 "ssh://root@$sftp$sftp_dir/$r" 2>/dev/null
  borg create "ssh://root@$sftp$sftp_dir/$r::a" "$data"
  repo="ssh://root@$sftp$sftp_dir/$r::a"; borg_dir=$sftp_dir/$r; fresh
  measure SFTP "$rtt" "borg (ssh)" sh -c "cd '$out' && borg extract '$repo'"
  rm -rf "${borg_dir:?}"
  # rsync pulls the plain tree: no decryption, no packs; a ceiling.
  fresh; mkdir -p "$sftp_dir/$r$(dirname "$data")"; cp -a "$data" "$sftp_dir/$r$(dirname "$data")/"
  src=$r; fresh
  measure SFTP "$rtt" "rsync over ssh (plain files)" \
    rsync -a -e "ssh $ssh_opts -p ${sftp#*:}" "root@${sftp%:*}:$sftp_dir/$src/" "$out/"
  doomed+=("${sftp_dir:?}/$src")
  # S3
  fresh; capsule_restore S3 "$rtt" "s3+http://$s3/capsule-test/$r"
  fresh; restic_restore S3 "$rtt" "s3:http://$s3/capsule-test/$r"
  fresh; rustic_restore S3 "$rtt" s3 bucket=capsule-test root="/$r" endpoint="http://$s3" \
    region=us-east-1 access_key_id="$AWS_ACCESS_KEY_ID" secret_access_key="$AWS_SECRET_ACCESS_KEY"
  # This run's S3 repositories, straight from MinIO's drive (a few hundred
  # objects): they would otherwise fill the disk the restored trees need.
  rm -rf "${servers:?}/minio/data/capsule-test/${work##*.}-"*
done

{
  echo "Data: $files files, $((bytes / 1048576)) MiB. Machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB; servers on loopback; RTT added by Toxiproxy."
  if [ "$pinned" = 1 ]; then
    echo "Pinned: the servers and Toxiproxy on CPU $(($(nproc) - 1)), every measured restore on CPU ${pin[2]}."
  fi
  if [ "$scratch_journaled" = 1 ]; then
    echo "Restore targets: a journaled ext4 file system on a loop device (direct I/O) over this machine's disk, each tree deleted once checked."
  else
    echo "Restore targets: this machine's disk, every tree kept until the run ended, after six quiet minutes."
  fi
  echo "Versions: $("$capsule" --version); $(restic version | head -1); ${restic_new:+$("$restic_new" version | head -1); }${rustic:+$("$rustic" --version | head -1); }$(borg --version); $(rclone version | head -1); $(rsync --version | head -1)"
  echo
  echo "| destination | RTT ms | tool | restore s | MB/s | peak RSS MiB | capsule fetches |"
  echo "|---|---:|---|---:|---:|---:|---|"
  for row in "${rows[@]}"; do
    IFS='|' read -r d rtt tool wall mbs rss ex <<<"$row"
    echo "| $d | $rtt | $tool | $wall | $mbs | $rss | ${ex:-} |"
  done
} | tee "${output:-/dev/null}"
rm -rf "${doomed[@]}"
