#!/usr/bin/env bash
# The Debian package on a clean Debian root: mmdebstrap makes a bookworm
# root from Debian's packages, the package is installed there with apt (its
# time measured), and a backup, a restore, the completions and a man page
# are run inside it with chroot; then `apt remove` must leave none of the
# package's files behind.
#
#   scripts/deb-test.sh [DEB]     (default: the newest target/dist/capsule_*.deb)
#
# Needs root and Debian's mirror; about half a minute here (a 179 MB root),
# so the test command runs it after scripts/package-check.sh (the
# package's file list, `systemd-analyze verify`, `man -l`).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "deb-test: needs root (chroot)" >&2; exit 2; }
deb=${1:-$(ls -t target/dist/capsule_*_amd64.deb 2>/dev/null | head -1)}
[ -f "$deb" ] || { echo "deb-test: no package: run scripts/release.sh first" >&2; exit 2; }
command -v mmdebstrap >/dev/null ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null; }
root=$(mktemp -d /tmp/capsule-debroot.XXXXXX)
cleanup() {
  umount -R "$root/dev" 2>/dev/null || true
  umount "$root/proc" 2>/dev/null || true
  rm -rf "$root"
}
trap cleanup EXIT
t0=$(date +%s.%N)
# man-db for `man`; nothing of capsule's dependencies is installed here.
mmdebstrap --quiet --variant=apt --include=man-db bookworm "$root" >/dev/null
t1=$(date +%s.%N)
echo "deb-test: a clean bookworm root in $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s ($(du -sm "$root" | cut -f1) MB)"
mount -t proc proc "$root/proc"
mount --rbind /dev "$root/dev"   # /dev/pts too, for apt's log
cp "$deb" "$root/tmp/"
inroot() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
t2=$(date +%s.%N)
inroot apt-get install -y -qq "/tmp/$(basename "$deb")" >/dev/null
t3=$(date +%s.%N)
echo "deb-test: apt install of $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB): $(awk "BEGIN{printf \"%.1f\", $t3 - $t2}") s"
inroot dpkg -L capsule | sort > "$root/tmp/files"
echo "deb-test: $(wc -l < "$root/tmp/files") paths installed"
inroot capsule --version
# A backup and a restore, byte for byte.
inroot sh -ec '
  mkdir -p /root/Documents/sub
  head -c 3000000 /dev/urandom > /root/Documents/big.bin
  echo "hello from a clean root" > /root/Documents/sub/note.txt
  ln -s sub/note.txt /root/Documents/link
  export CAPSULE_PASSWORD=deb-test
  capsule --repo /root/repo init >/dev/null
  capsule --repo /root/repo backup /root/Documents
  capsule --repo /root/repo restore latest --target /root/r
  diff -r /root/Documents /root/r/root/Documents
  echo "deb-test: backup and restore identical"
  capsule completions bash | grep -q "_capsule()" && echo "deb-test: completions ok"
  test -f /usr/share/bash-completion/completions/capsule
  MANPAGER=cat MANWIDTH=80 man capsule-backup | grep -q "capsule-backup" && echo "deb-test: man capsule-backup ok"
'
inroot apt-get remove -y -qq capsule >/dev/null
left=$(while read -r p; do
  [ -f "$root$p" ] || [ -L "$root$p" ] && echo "$p"
done < "$root/tmp/files" || true)
if [ -n "$left" ]; then
  echo "deb-test: apt remove left files of the package behind:" >&2
  echo "$left" >&2
  exit 1
fi
[ -d "$root/root/repo" ] || { echo "deb-test: the user's repository is gone after apt remove" >&2; exit 1; }
echo "deb-test: apt remove left no file of the package; the user's repository stays"
echo "deb-test: ok"
