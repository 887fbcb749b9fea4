#!/usr/bin/env bash
# The project's test command (the README's, and what CI runs).
# Needs only the Rust and Go toolchains; installs any missing system tool it
# uses (util-linux, Samba, OpenSSH, curl from Debian; MinIO and Toxiproxy
# with `go install`).
set -euo pipefail
cd "$(dirname "$0")/.."

# setpriv (util-linux) runs the permission test as an unprivileged user.
if ! command -v setpriv >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq util-linux
fi

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -q -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked -q

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
cargo test --workspace --locked 2>&1 | tee "$log"
# One closing line with the totals of every test binary (the last binary
# cargo runs is an empty doc-test pass, which would otherwise close the log).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1) } }
     END { printf "capsule: %d passed, %d failed\n", p, f }' "$log"
