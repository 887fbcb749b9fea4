#!/usr/bin/env bash
# Estimator accuracy: `capsule estimate` predicts, then real backups run,
# on the benchmark datasets over SMB, SFTP and S3 through Toxiproxy at 2 and
# 10 ms round trip. Prints a Markdown table of predicted vs actual capsule
# times for the initial backup and the hourly run with no history (the
# model alone), and for a second hourly run predicted after the first two
# were recorded (corrected by history, checked on a run it has not seen),
# and for a full restore from the destination with a cold cache into a new
# directory (the model alone).
#
#   bench/estimate.sh [--rtt "2 10"] [--sets "small mixed docs"] [--dests "Local SMB SFTP S3"]
#                     [--repeat N] [--cold] [--pin] [--output FILE] [--keep-json DIR]
#                     [--trace-restore DIR] [--restore-repeat N] [--initial-repeat N]
#
# --repeat N runs the estimate N times in a row (each in a new scratch
# directory) and reports the median prediction and the spread of the
# initial one and of the restore; --cold drops the page cache (root only)
# before every estimate, before the initial backup and before the restore; --pin gives
# the servers a core of their own, as a NAS has its own CPU; --keep-json
# keeps every estimate's --json in DIR (SET-DEST-RTT-N.json);
# --trace-restore writes the restore's request trace to DIR
# (SET-DEST-RTT.trace, `--trace-requests`), which costs the restore a little;
# --restore-repeat N restores N times (the cache dropped before each) and
# reports the median and how far the restores lay from it: what this
# machine itself varies, which no estimate can be closer than;
# --initial-repeat N does the same for the initial backup (each further one
# into a new repository of its own, after the row's restores).
#
# Datasets:
#   small      10,000 x 50 KiB random files
#   mixed      ~300 MB: 8 KiB, 256 KiB and 8 MiB files, half compressible
#   docs       the Rust std HTML docs from ~/.rustup (~8,000 files, ~120 MB)
#   toolchain  a Rust toolchain's whole share/doc (~52,000 files, ~670 MB):
#              a tree the model was not fitted on
#   usrshare   this machine's /usr/share (~50,000 files, ~760 MB): another
#              unseen tree
#   hidden     the Go toolchain, /usr/share and /usr/include (~76,000
#              files): issue 62's tree for the restore estimate's swings
#   sources    the crate sources cargo fetched (~/.cargo/registry/src, about
#              28,000 files) with a Rust toolchain's lib (rlibs and shared
#              objects, ~500 MB) and /usr/lib/python3: a source tree of many
#              small files and a few large assets, not used before
# The hourly run adds 100 files of 50 KiB (5 MB), which is what estimate
# is told to assume (--hourly-files 100 --hourly-bytes 5000K).
set -euo pipefail
cd "$(dirname "$0")/.."

rtts="2 10" sets="small mixed docs" output="" keep_json="" trace_dir="" dests="SMB SFTP S3" repeat=1 cold=0 pin_it=0 rrepeat=1 irepeat=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rtt) rtts=$2; shift ;;
    --sets) sets=$2; shift ;;
    --dests) dests=$2; shift ;;
    --repeat) repeat=$2; shift ;;
    --cold) cold=1 ;;
    --pin) pin_it=1 ;;
    --output) output=$2; shift ;;
    --keep-json) keep_json=$2; mkdir -p "$keep_json"; shift ;;
    --trace-restore) trace_dir=$2; mkdir -p "$trace_dir"; shift ;;
    --restore-repeat) rrepeat=$2; shift
      [[ "$rrepeat" =~ ^[1-9][0-9]*$ ]] || { echo "--restore-repeat needs a whole number of restores, 1 or more (got $rrepeat)" >&2; exit 2; } ;;
    --initial-repeat) irepeat=$2; shift
      [[ "$irepeat" =~ ^[1-9][0-9]*$ ]] || { echo "--initial-repeat needs a whole number of backups, 1 or more (got $irepeat)" >&2; exit 2; } ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

cargo build --release -q -p capsule
capsule=$PWD/target/release/capsule
work=$(mktemp -d /tmp/capsule-estbench.XXXXXX)
# shellcheck source=bench/lib.sh
source bench/lib.sh
use_servers
# Restores, the estimate's own sample restores among them, go to a
# journaled ext4 file system when one can be mounted (see scratch_disk).
scratch_disk "$work/disk" 32
if [ "$pin_it" = 1 ]; then pin_servers; fi
drop_caches() {
  [ "$cold" = 1 ] || return 0
  sync
  echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "--cold: cannot drop the page cache (not root?)" >&2
}

export CAPSULE_PASSWORD=bench
export CAPSULE_SMB_PASSWORD=$CAPSULE_TEST_SMB_PASSWORD
export CAPSULE_SFTP_KEY=$CAPSULE_TEST_SFTP_KEY
export AWS_ACCESS_KEY_ID=$CAPSULE_TEST_S3_KEY AWS_SECRET_ACCESS_KEY=$CAPSULE_TEST_S3_SECRET

make_set() {
  local name=$1 dir=$work/data/$1
  mkdir -p "$dir"
  case "$name" in
    small) python3 - "$dir" <<'PY'
import os, sys
d = sys.argv[1]
for i in range(10000):
    sub = os.path.join(d, "d%03d" % (i // 100))
    os.makedirs(sub, exist_ok=True)
    open(os.path.join(sub, "f%05d" % i), "wb").write(os.urandom(51200))
PY
    ;;
    mixed) python3 - "$dir" <<'PY'
import os, random, sys
d = sys.argv[1]
random.seed(7)
n = 0
for size, count in ((8 << 10, 3600), (256 << 10, 360), (8 << 20, 22)):
    for i in range(count):
        sub = os.path.join(d, "s%d" % size, "d%03d" % (i // 100))
        os.makedirs(sub, exist_ok=True)
        if n % 2:
            data = os.urandom(size)
        else:
            words = [b"alpha", b"beta", b"gamma", b"delta", b"\n"]
            data = b" ".join(random.choice(words) for _ in range(size // 5))[:size]
        open(os.path.join(sub, "f%05d" % i), "wb").write(data)
        n += 1
PY
    ;;
    docs) cp -r "$(ls -d ~/.rustup/toolchains/*/share/doc/rust/html/std | head -1)" "$dir/std" ;;
    toolchain) cp -r "$(ls -d ~/.rustup/toolchains/stable-*/share/doc | head -1)" "$dir/doc" ;;
    usrshare) cp -r /usr/share "$dir/share" 2>/dev/null || true ;;
    hidden)
      cp -r "$(go env GOROOT)" "$dir/go"
      cp -r /usr/share "$dir/share" 2>/dev/null || true
      cp -r /usr/include "$dir/include" 2>/dev/null || true
      ;;
    sources)
      cp -r ~/.cargo/registry/src "$dir/src"
      cp -r "$(ls -d ~/.rustup/toolchains/stable-*/lib | head -1)" "$dir/lib"
      cp -r /usr/lib/python3 "$dir/python3" 2>/dev/null || true
      ;;
  esac
  echo "$dir"
}

# Backups are timed with bash's $EPOCHREALTIME: a python3 start-up (~40 ms)
# inside the timed span would count as backup time.
secs() { python3 -c "print(round($2 - $1, 3))"; }

rows=()
for set in $sets; do
  data=$(make_set "$set")
  sleep 1.2 # past capsule's one-second re-read window
  files=$(find "$data" -type f | wc -l)
  for rtt in $rtts; do
    proxies "est-$set-$rtt" "$rtt"
    for dest in $dests; do
      # The local disk has no round trip to vary: one row, at the first RTT.
      if [ "$dest" = Local ] && [ "$rtt" != "${rtts%% *}" ]; then continue; fi
      r=est-$set-$rtt-$RANDOM
      shown_rtt="$rtt ms"
      case $dest in
        Local) url=$work/local-$r shown_rtt="—" ;;
        SMB) url="smb://backup@$smb/backup/$r" ;;
        SFTP) url="sftp://root@$sftp$CAPSULE_TEST_SFTP_DIR/$r" ;;
        S3) url="s3+http://$s3/capsule-test/$r" ;;
      esac
      export CAPSULE_STATE_DIR=$work/state-$r CAPSULE_CACHE_DIR=$work/cache-$r
      est() {
        TMPDIR=$work/disk "${pin[@]}" "$capsule" estimate "$data" --to "$url" --hourly-files 100 --hourly-bytes 5000K --json |
          tee ${keep_json:+"$keep_json/$set-$dest-$rtt-$1.json"} |
          python3 -c 'import json,sys; j=json.load(sys.stdin); p=j["predicted"]; print(p["initial"], p["hourly"], p["restore"], p.get("no_change", 0), j.get("uncertainty", 0), j.get("initial_uncertainty", 0))'
      }
      inits=() hours=() rests=() nochs=() uncs=() iuncs=()
      for ((k = 0; k < repeat; k++)); do
        drop_caches
        read -r a b c d u iu < <(est "$k")
        inits+=("$a") hours+=("$b") rests+=("$c") nochs+=("$d") uncs+=("$u") iuncs+=("$iu")
      done
      med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
      p_init=$(med "${inits[@]}") p_hour=$(med "${hours[@]}") p_rest=$(med "${rests[@]}") p_noch=$(med "${nochs[@]}")
      echo "estimates: initial ${inits[*]}; no-change ${nochs[*]}; restore ${rests[*]}; uncertainty ${uncs[*]}; initial ${iuncs[*]}" >&2
      spread_of() { python3 -c "v=[$1]; m=$2; print('±%.0f%%' % (max(abs(x-m) for x in v)/m*100))"; }
      spread=$(spread_of "$(IFS=,; echo "${inits[*]}")" "$p_init")
      r_spread=$(spread_of "$(IFS=,; echo "${rests[*]}")" "$p_rest")
      unc=$(med "${uncs[@]}") iunc=$(med "${iuncs[@]}")
      "${pin[@]}" "$capsule" -r "$url" -q init
      drop_caches
      t0=$EPOCHREALTIME; "${pin[@]}" "$capsule" -r "$url" -q backup "$data"; t1=$EPOCHREALTIME
      a_init=$(secs "$t0" "$t1")
      sleep 1.1 # past the re-read window: nothing is read again
      t0=$EPOCHREALTIME; "${pin[@]}" "$capsule" -r "$url" -q backup "$data"; t1=$EPOCHREALTIME
      a_noch=$(secs "$t0" "$t1")
      # An hourly run: 100 new files, then a second one, predicted by the
      # estimate corrected from the two runs before it.
      hour() {
        local d=$data/hourly-$r-$1
        mkdir -p "$d"
        for i in $(seq 1 100); do head -c 51200 /dev/urandom >"$d/f$i"; done
        t0=$EPOCHREALTIME; "${pin[@]}" "$capsule" -r "$url" -q backup "$data"; t1=$EPOCHREALTIME
        secs "$t0" "$t1"
      }
      a_hour=$(hour 1)
      read -r _ c_hour _ _ _ _ < <(est corrected)
      a_hour2=$(hour 2)
      rm -rf "$data"/hourly-"$r"-*
      rests_a=()
      for k in $(seq 1 "$rrepeat"); do
        out=$work/disk/restored-$r-$k
        drop_caches
        trace=()
        if [ -n "$trace_dir" ] && [ "$k" = 1 ]; then trace=(--trace-requests "$trace_dir/$set-$dest-$rtt.trace"); fi
        t0=$EPOCHREALTIME; "${pin[@]}" "$capsule" -r "$url" -q --no-cache "${trace[@]}" restore latest --target "$out"; t1=$EPOCHREALTIME
        rests_a+=("$(secs "$t0" "$t1")")
        # Without the journaled scratch file system, kept until the set is
        # done: on ext4 without a journal, creating files just after
        # deleting many is slow for minutes, which would land on the next
        # row.
        if [ "$scratch_journaled" = 1 ]; then rm -rf "$out"; fi
      done
      # More initial backups, each into a new repository of its own.
      inits_a=("$a_init")
      for ((k = 2; k <= irepeat; k++)); do
        "${pin[@]}" "$capsule" -r "$url-i$k" -q init
        drop_caches
        t0=$EPOCHREALTIME; "${pin[@]}" "$capsule" -r "$url-i$k" -q backup "$data"; t1=$EPOCHREALTIME
        inits_a+=("$(secs "$t0" "$t1")")
      done
      echo "initial backups: ${inits_a[*]}" >&2
      a_init=$(med "${inits_a[@]}")
      a_ispread=$(spread_of "$(IFS=,; echo "${inits_a[*]}")" "$a_init")
      a_rest=$(med "${rests_a[@]}")
      a_rspread=$(spread_of "$(IFS=,; echo "${rests_a[*]}")" "$a_rest")
      row=$(python3 -c "
pi,ai,ph,ah,ch,ah2,pr,ar,pn,an=$p_init,$a_init,$p_hour,$a_hour,$c_hour,$a_hour2,$p_rest,$a_rest,$p_noch,$a_noch
sp, rsp, arsp, aisp = '$spread', '$r_spread', '$a_rspread', '$a_ispread'
unc, iunc = '±%.0f%%' % ($unc * 100), '±%.0f%%' % ($iunc * 100)
e=lambda p,a: '%+.0f%%' % ((p-a)/a*100)
print('| $set ($files files) | $dest | $shown_rtt | %s | %.2f | %s | %s | %.2f | %s | %s | %.2f | %.2f | %s | %.2f | %.2f | %s | %.2f | %.2f | %s | %.2f | %s | %.2f | %s | %s |' % (unc, pi, iunc, sp, ai, aisp, e(pi,ai), pn, an, e(pn,an), ph, ah, e(ph,ah), ch, ah2, e(ch,ah2), pr, rsp, ar, arsp, e(pr,ar)))")
      rows+=("$row")
      echo "$row" >&2
      case $dest in
        SMB) rm -rf "${CAPSULE_TEST_SMB_DIR:?}/$r" "${CAPSULE_TEST_SMB_DIR:?}/$r"-i* ;;
        SFTP) rm -rf "${CAPSULE_TEST_SFTP_DIR:?}/$r" "${CAPSULE_TEST_SFTP_DIR:?}/$r"-i* ;;
        Local) rm -rf "$url" "$url"-i* ;;
      esac
    done
  done
  rm -rf "$data" "$work"/disk/restored-*
done

{
  echo "Estimator accuracy ($(nproc) cores, $(date -u +%Y-%m-%d), capsule $("$capsule" --version | cut -d' ' -f2)$([ "$pin_it" = 1 ] && echo ", servers pinned to a core of their own")$([ "$cold" = 1 ] && echo ", page cache dropped before every estimate, the initial backup and the restore")); estimates per row: $repeat (median; spread = farthest from it):"
  echo "predicted = \`capsule estimate\` with no history; actual = wall time of \`capsule backup\`;"
  echo "hourly = 100 new 50 KiB files; 2nd hourly = 100 more, predicted by the estimate re-run after the first two runs were recorded (corrected by history)."
  echo "Restores and the estimate's samples: $([ "$scratch_journaled" = 1 ] && echo "a journaled ext4 file system on a loop device (direct I/O)" || echo "this machine's disk")."
  echo
  echo "uncertainty = the estimate's own ± (the median of the estimates'), initial ± = the same for the initial backup (with the disk's cold read); spread = how far the estimates in a row lay from their median; actual = the median of $irepeat initial backups and of $rrepeat restores, actual spread = how far they lay from it."
  echo
  echo "| dataset | destination | RTT | uncertainty | initial predicted s | initial ± | spread | actual s | actual spread | error | no-change predicted s | actual s | error | hourly predicted s | actual s | error | 2nd hourly corrected s | actual s | error | restore predicted s | spread | actual s | actual spread | error |"
  echo "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
} | tee "${output:-/dev/null}"
