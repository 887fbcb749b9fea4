# Shared by the benchmark scripts (sourced; the proxy helpers need $api,
# the Toxiproxy API).

# make_tree DIR FILES: FILES tiny files (about 12 bytes), 100 a directory.
make_tree() {
  python3 - "$1" "$2" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // 10000), "e%03d" % ((i // 100) % 100))
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%02d" % (i % 100)), "w") as f:
        f.write("file %d\n" % i)
PY
}

# proxy NAME UPSTREAM RTT_MS -> prints host:port to use
proxy() {
  local name=$1 upstream=$2 rtt=$3
  if [ "$rtt" = 0 ]; then echo "$upstream"; return; fi
  curl -fs -X DELETE "$api/proxies/$name" >/dev/null 2>&1 || true
  local listen
  listen=$(curl -fs -X POST "$api/proxies" \
    -d "{\"name\":\"$name\",\"listen\":\"127.0.0.1:0\",\"upstream\":\"$upstream\"}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["listen"])')
  local half=$((rtt / 2)) ; [ "$half" -lt 1 ] && half=1
  for dir in upstream downstream; do
    curl -fs -X POST "$api/proxies/$name/toxics" \
      -d "{\"name\":\"lat_$dir\",\"type\":\"latency\",\"stream\":\"$dir\",\"attributes\":{\"latency\":$half}}" >/dev/null
  done
  echo "$listen"
}


# use_servers: sets $servers and $api, sources the servers' env, and arranges
# for $work (and servers this script started) to go at exit. Reuses servers
# already started with scripts/servers.sh when CAPSULE_TEST_SERVERS is set.
use_servers() {
  if [ -n "${CAPSULE_TEST_SERVERS:-}" ] && [ -f "$CAPSULE_TEST_SERVERS/env" ]; then
    servers=$CAPSULE_TEST_SERVERS
    trap 'pin_release; scratch_release; rm -rf "$work"' EXIT
  else
    servers=$work/servers
    trap 'pin_release; scratch_release; scripts/servers.sh stop "$servers"; rm -rf "$work"' EXIT
    scripts/servers.sh start "$servers"
  fi
  # shellcheck disable=SC1091
  source "$servers/env"
  api=$CAPSULE_TEST_PROXY_API
}

# proxies NAME-SUFFIX RTT: sets $smb, $sftp, $s3 (host:port through
# Toxiproxy at RTT ms) and CAPSULE_SFTP_KNOWN_HOSTS for the SFTP proxy.
proxies() {
  smb=$(proxy "smb-$1" "$CAPSULE_TEST_SMB_UPSTREAM" "$2")
  sftp=$(proxy "sftp-$1" "$CAPSULE_TEST_SFTP_UPSTREAM" "$2")
  s3=$(proxy "s3-$1" "$CAPSULE_TEST_S3_UPSTREAM" "$2")
  local kh="$work/kh-$1"
  printf '[%s]:%s %s\n' "${sftp%:*}" "${sftp#*:}" "$(cut -d' ' -f1,2 "$servers/ssh/host_key.pub")" >"$kh"
  export CAPSULE_SFTP_KNOWN_HOSTS=$kh
}

# scratch_disk DIR GIB: mounts a journaled ext4 file system of GIB GiB
# (sparse) at DIR for restore targets, and sets scratch_journaled=1; where
# that cannot be done (not root, no loop devices) DIR is a plain directory
# and scratch_journaled=0.
#
# Why: this machine's root is ext4 without a journal. There the inode
# allocator skips inodes deleted within the last 60 s (6 minutes while
# their inode table block is dirty) and reads the table for each one, so
# a restore of 52,000 files made just after another was deleted took 2.5×
# as long. A journaled ext4, which is what a laptop or desktop has, does
# not do this, so restores on it can run back to back and be deleted as
# they go. The loop device uses direct I/O, so the image's pages are not
# cached twice. The inode tables and the journal are written by mkfs, not
# by the kernel's lazy init after mounting, which would otherwise compete
# with the first restores for the disk (a local restore measured first
# took 6.49 s against 3.94 s in the run before).
scratch_mount="" scratch_loop="" scratch_journaled=0
scratch_disk() {
  local dir=$1 gib=$2 img=$work/scratch.img
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ] && command -v losetup >/dev/null && command -v mkfs.ext4 >/dev/null &&
    truncate -s "${gib}G" "$img" && mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$img" &&
    scratch_loop=$(losetup -f --show --direct-io=on "$img"); then
    if mount "$scratch_loop" "$dir"; then
      scratch_mount=$dir scratch_journaled=1
      return 0
    fi
    losetup -d "$scratch_loop"
    scratch_loop=""
  fi
  rm -f "$img"
  echo "no journaled scratch file system (needs root and loop devices): restores go to $dir" >&2
}

# scratch_release: unmounts what scratch_disk mounted (called at exit).
scratch_release() {
  if [ -n "$scratch_mount" ]; then umount "$scratch_mount" || umount -l "$scratch_mount" || true; fi
  if [ -n "$scratch_loop" ]; then losetup -d "$scratch_loop" || true; fi
  scratch_mount="" scratch_loop=""
}

# pin_servers: moves the servers and Toxiproxy (every process they run now,
# and so every one they start later) to the last CPU, and sets $pin to the
# prefix that runs a measured client on the others. pin_release undoes it
# (at exit). Without it, $pin is empty.
#
# Why: on this 2-core machine the servers and the proxy take a fifth of the
# CPU a restore needs, which a NAS or an object store, with CPUs of their
# own, never takes from the laptop. With both the local and the remote runs
# on the same client CPUs, the ratio between them is what the network
# costs the client, not what loopback servers cost the machine.
pin=()
pinned=0
server_pids() {
  local todo=() p
  for p in "$servers"/*.pid; do [ -s "$p" ] && todo+=("$(cat "$p")"); done
  while [ ${#todo[@]} -gt 0 ]; do
    p=${todo[0]}; todo=("${todo[@]:1}")
    kill -0 "$p" 2>/dev/null || continue
    echo "$p"
    # shellcheck disable=SC2207
    todo+=($(pgrep -P "$p" || true))
  done
}
pin_servers() {
  local last=$(($(nproc) - 1))
  if [ "$last" -lt 1 ]; then echo "--pin needs at least 2 CPUs" >&2; exit 2; fi
  local p
  for p in $(server_pids); do taskset -a -cp "$last" "$p" >/dev/null; done
  if [ "$last" = 1 ]; then pin=(taskset -c 0); else pin=(taskset -c "0-$((last - 1))"); fi
  pinned=1
}
pin_release() {
  [ "$pinned" = 1 ] || return 0
  local p
  for p in $(server_pids); do taskset -a -cp "0-$(($(nproc) - 1))" "$p" >/dev/null 2>&1 || true; done
  pinned=0
}

# run_by_daemon: moves the test clock (the file $clock, the time $now) an
# hour on, and waits until `$capsule status` shows a successful run started
# then (the daemon's log, $w/daemon.log, is printed when none comes).
run_by_daemon() {
  now=$((now + 3600)); echo "$now" >"$clock"
  local started=0
  for _ in $(seq 3000); do
    started=$("$capsule" --json status | python3 -c 'import json,sys; r=json.load(sys.stdin)["profiles"][0]["last_success"]; print(r["started_unix"] if r else 0)')
    [ "$started" = "$now" ] && break
    sleep 0.1
  done
  [ "$started" = "$now" ] || { echo "the daemon made no run at $now" >&2; cat "$w/daemon.log" >&2; exit 1; }
}

# need PROGRAM:PACKAGE...: installs (apt-get) the packages whose programs
# are missing.
need() {
  local missing=() p
  for p in "$@"; do command -v "${p%%:*}" >/dev/null || missing+=("${p#*:}"); done
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# cold: writes dirty pages out and drops the page cache (root).
cold() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# wall CMD...: prints the wall seconds CMD took (its output in
# $work/last.log and $work/last.err), or nan when it failed.
wall() {
  local t0 t1
  t0=$(date +%s.%N)
  if ! "$@" >"$work/last.log" 2>"$work/last.err"; then
    echo "  FAILED: $*" >&2; tail -3 "$work/last.err" >&2
    echo nan; return 0
  fi
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}

# per_sec SECS MIB: "N MiB/s", or "failed" for nan.
per_sec() { python3 -c "s='$1'; print('failed' if s == 'nan' else f'{$2 / float(s):.0f} MiB/s')"; }

# restic_on DEST HOST ARGS...: restic on the repository "$name-r" at DEST
# (S3, SFTP or SMB, through rclone) reached at HOST (host:port). Needs
# $name, $ssh_opts and $sftp_dir.
# (A later -r in ARGS wins: `restic_on SMB HOST -r LOCAL copy --from-repo
# "$(restic_repo SMB HOST)"` copies out of it.)
restic_on() {
  local dest=$1 host=$2; shift 2
  case $dest in
    S3) restic -r "$(restic_repo S3 "$host")" "$@" ;;
    SFTP) restic -o sftp.command="ssh $ssh_opts -p ${host#*:} root@${host%:*} -s sftp" \
      -r "$(restic_repo SFTP "$host")" "$@" ;;
    SMB) RCLONE_CONFIG_NAS_TYPE=smb RCLONE_CONFIG_NAS_HOST=${host%:*} RCLONE_CONFIG_NAS_PORT=${host#*:} \
      RCLONE_CONFIG_NAS_USER=backup RCLONE_CONFIG_NAS_PASS=$(rclone obscure "$CAPSULE_TEST_SMB_PASSWORD") \
      restic -r "$(restic_repo SMB "$host")" "$@" ;;
  esac
}

# restic_repo DEST HOST: restic's name for the repository restic_on uses.
restic_repo() {
  case $1 in
    S3) echo "s3:http://$2/capsule-test/$name-r" ;;
    SFTP) echo "sftp:root@${2%:*}:$sftp_dir/$name-r" ;;
    SMB) echo "rclone:nas:backup/$name-r" ;;
  esac
}

# capsule_url DEST HOST: the URL of the capsule repository "$name-c" at
# DEST reached at HOST.
capsule_url() {
  case $1 in
    S3) echo "s3+http://$2/capsule-test/$name-c" ;;
    SFTP) echo "sftp://root@$2$sftp_dir/$name-c" ;;
    SMB) echo "smb://backup@$2/backup/$name-c" ;;
  esac
}

# net_bench_env: what the network benchmarks share once the servers are up
# (use_servers): with pin_it=1 the servers on the last core and this
# script (so every client it starts) on the others; the servers'
# credentials for capsule and restic; $ssh_opts, $smb_dir, $sftp_dir, and
# $name, this run's prefix for repository names.
net_bench_env() {
  if [ "${pin_it:-0}" = 1 ]; then pin_servers; taskset -cp "${pin[2]}" $$ >/dev/null; fi
  export CAPSULE_PASSWORD=bench RESTIC_PASSWORD=bench RESTIC_FROM_PASSWORD=bench
  export CAPSULE_SMB_PASSWORD=$CAPSULE_TEST_SMB_PASSWORD
  export CAPSULE_SFTP_KEY=$CAPSULE_TEST_SFTP_KEY
  export AWS_ACCESS_KEY_ID=$CAPSULE_TEST_S3_KEY AWS_SECRET_ACCESS_KEY=$CAPSULE_TEST_S3_SECRET
  export CAPSULE_SFTP_KNOWN_HOSTS=$CAPSULE_TEST_KNOWN_HOSTS
  ssh_opts="-i $CAPSULE_TEST_SFTP_KEY -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
  smb_dir=$CAPSULE_TEST_SMB_DIR sftp_dir=$CAPSULE_TEST_SFTP_DIR
  name=${work##*.}
}

# take_out DEFAULT ARGS...: sets $out (--out DIR, else DEFAULT) and the array
# $args (every other argument, in order), for scripts that hand their
# arguments on to a Python body (year.sh, fleet-year.sh).
take_out() {
  out=$1
  shift
  args=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) out=$2; shift ;;
      *) args+=("$1") ;;
    esac
    shift
  done
}
