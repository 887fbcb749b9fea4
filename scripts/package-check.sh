#!/usr/bin/env bash
# What the test command checks of the release cheaply (scripts/deb-test.sh
# installs the package on a clean Debian root, which takes minutes): the
# package and the archive are made from the debug binary by
# scripts/release.sh, and then
#   - the package holds the binary, a man page for every command, the three
#     completions, both units, the README and the copyright, and nothing
#     else; its control file recommends fuse3 and suggests btrfs-progs, lvm2;
#   - the archive holds the same files;
#   - both units pass `systemd-analyze verify` (against the package's tree);
#   - every man page renders with `man -l` without a warning.
set -euo pipefail
cd "$(dirname "$0")/.."
# --release checks a release build instead (what scripts/release.sh ships).
flag=--debug bin=target/debug/capsule
[ "${1:-}" = --release ] && flag= bin=target/release/capsule
out=target/package-check
rm -rf "$out"
scripts/release.sh $flag --allow-dirty --out "$out" >/dev/null
deb=$(ls "$out"/capsule_*_amd64.deb)
tgz=$(ls "$out"/capsule-*-x86_64-linux.tar.gz)
fail=0
bad() { echo "package: $*" >&2; fail=1; }
(cd "$out" && sha256sum -c --quiet ./*.sha256) || bad "a checksum does not match"

files=$(dpkg-deb -c "$deb" | awk '{print $6}' | sed 's,^\./,,; s,^,/,' | grep -v '/$' | sort)
commands=$("$bin" --help | awk '/^Commands:/{on=1; next} on && /^  [a-z]/{print $1} on && /^$/{exit}' | grep -vx help)
for want in /usr/bin/capsule /usr/share/bash-completion/completions/capsule \
    /usr/share/zsh/vendor-completions/_capsule /usr/share/fish/vendor_completions.d/capsule.fish \
    /usr/lib/systemd/system/capsule.service /usr/lib/systemd/user/capsule.service \
    /usr/share/doc/capsule/README.md /usr/share/doc/capsule/copyright /usr/share/man/man1/capsule.1.gz; do
  grep -qx "$want" <<<"$files" || bad "$deb lacks $want"
done
for c in $commands; do
  grep -qx "/usr/share/man/man1/capsule-$c.1.gz" <<<"$files" || bad "$deb has no man page for capsule $c"
done
pages=$(grep -c '^/usr/share/man/man1/' <<<"$files" || true)
[ "$pages" -ge 40 ] || bad "only $pages man pages"
others=$(grep -v '^/usr/share/man/man1/capsule[-a-z]*\.1\.gz$' <<<"$files" | grep -vx -e /usr/bin/capsule \
  -e /usr/share/bash-completion/completions/capsule -e /usr/share/zsh/vendor-completions/_capsule \
  -e /usr/share/fish/vendor_completions.d/capsule.fish -e /usr/lib/systemd/system/capsule.service \
  -e /usr/lib/systemd/user/capsule.service -e /usr/share/doc/capsule/README.md \
  -e /usr/share/doc/capsule/copyright || true)
[ -z "$others" ] || bad "unexpected files in the package: $others"
control=$(dpkg-deb -f "$deb")
grep -q '^Recommends: fuse3' <<<"$control" || bad "the package does not recommend fuse3"
grep -q '^Suggests: btrfs-progs, lvm2' <<<"$control" || bad "the package does not suggest btrfs-progs, lvm2"
grep -q '^Depends: .*libc6' <<<"$control" || bad "the package's dependencies lack libc6"

# The archive: the same files, under capsule-VERSION-x86_64-linux/.
n_tar=$(tar tzf "$tgz" | grep -vc '/$')
n_deb=$(grep -vc '/usr/share/doc/capsule/copyright' <<<"$files")
# The archive has both licences where the package has its copyright file.
[ "$n_tar" = $((n_deb + 2)) ] || bad "the archive has $n_tar files, the package $n_deb (+2 licences)"

tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
dpkg-deb -x "$deb" "$tree"
if command -v systemd-analyze >/dev/null; then
  for u in system user; do
    # This system's units and tools, and the package's binary where the
    # unit will find /usr/bin/capsule.
    sed "s,/usr/bin/capsule,$tree/usr/bin/capsule,g" "$tree/usr/lib/systemd/$u/capsule.service" \
      > "$tree/capsule.service"
    msg=$(systemd-analyze verify "$tree/capsule.service" 2>&1) ||
      bad "the $u unit fails systemd-analyze verify: $msg"
    [ -z "$msg" ] || bad "systemd-analyze verify warns on the $u unit: $msg"
  done
else
  bad "no systemd-analyze to verify the units"
fi
rendered=0
for p in "$tree"/usr/share/man/man1/*.1.gz; do
  warn=$(MANWIDTH=80 man -l "$p" 2>&1 >/dev/null) || bad "man -l $(basename "$p") failed: $warn"
  [ -z "$warn" ] || bad "man -l $(basename "$p") warns: $warn"
  rendered=$((rendered + 1))
done
[ $fail = 0 ] || exit 1
echo "package: $(basename "$deb") ($(du -k "$deb" | cut -f1) KiB, $(wc -l <<<"$files") files, $pages man pages rendered: $rendered), $(basename "$tgz") ($n_tar files); units verified"
