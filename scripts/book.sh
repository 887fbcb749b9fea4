#!/usr/bin/env bash
# The user guide (book/, mdBook): renews its generated reference pages,
# builds it into target/book, and checks it: the generated pages are
# current, every link and anchor resolves, every `capsule …` line it shows
# names a command and options the binary has, and every CAPSULE_* variable
# capsule reads is listed.
#
#   scripts/book.sh [--write] [--capsule BIN]
#
# --write renews book/src/reference/{commands,exit-codes,configuration}.md;
# without it a stale page is an error. mdBook is installed with cargo into
# ~/.cache/capsule-tools the first time (about two minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
write=0
capsule=
while [ $# -gt 0 ]; do
  case "$1" in
    --write) write=1 ;;
    --capsule) capsule=$2; shift ;;
    *) echo "usage: scripts/book.sh [--write] [--capsule BIN]" >&2; exit 2 ;;
  esac
  shift
done
MDBOOK_VERSION=0.5.4
tools=${CAPSULE_TOOLS:-$HOME/.cache/capsule-tools}
mdbook=$tools/bin/mdbook
if ! "$mdbook" --version 2>/dev/null | grep -q "v$MDBOOK_VERSION"; then
  echo "book: installing mdBook $MDBOOK_VERSION (cargo install, once)" >&2
  cargo install --locked --quiet --no-default-features --version "$MDBOOK_VERSION" \
    --root "$tools" mdbook
fi
if [ -z "$capsule" ]; then
  cargo build --locked -q -p capsule
  capsule=target/debug/capsule
fi
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
python3 scripts/book.py generate "$capsule" "$gen"
stale=0
for f in commands.md exit-codes.md configuration.md; do
  if ! cmp -s "$gen/reference/$f" "book/src/reference/$f"; then
    if [ $write = 1 ]; then
      cp "$gen/reference/$f" "book/src/reference/$f"
      echo "book: renewed book/src/reference/$f"
    else
      echo "book: book/src/reference/$f is not what the binary and sources say; run scripts/book.sh --write" >&2
      diff -u "book/src/reference/$f" "$gen/reference/$f" | head -20 >&2 || true
      stale=1
    fi
  fi
done
"$mdbook" build book -d "$PWD/target/book" >/dev/null 2>"$gen/mdbook.log" ||
  { cat "$gen/mdbook.log" >&2; exit 1; }
if grep -q "WARN\|ERROR" "$gen/mdbook.log"; then cat "$gen/mdbook.log" >&2; exit 1; fi
python3 scripts/book.py check "$capsule" target/book
[ $stale = 0 ] || exit 1
echo "book: built into target/book ($(find target/book -name '*.html' | wc -l) pages)"
