#!/usr/bin/env bash
# The project's test command (the README's, and what CI runs).
# Needs only the Rust toolchain; installs any missing system tool it uses.
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

echo "== tests"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --locked 2>&1 | tee "$log"
# One closing line with the totals of every test binary (the last binary
# cargo runs is an empty doc-test pass, which would otherwise close the log).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i == "passed;") p += $(i-1); if ($i == "failed;") f += $(i-1) } }
     END { printf "capsule: %d passed, %d failed\n", p, f }' "$log"
