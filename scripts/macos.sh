#!/bin/sh
# capsule for macOS, built on Linux: type-checks, lints and links the
# workspace for Apple silicon and Intel Macs with Debian's rustc-web
# (std built from source with -Zbuild-std) and zig as C compiler, archiver
# and linker. No binary is run here: there is no Mac.
#
#   scripts/macos.sh install                 the packages, wrappers, stubs
#   scripts/macos.sh check   [TARGET...]     cargo check --workspace --all-targets
#   scripts/macos.sh clippy  [TARGET...]     clippy --all-targets -D warnings
#   scripts/macos.sh build   [TARGET...]     the capsule binary, then `file` on it
#   scripts/macos.sh all                     clippy -D warnings for x86_64 (every
#                                            target), the arm64 binary linked
#
# TARGET is aarch64-apple-darwin (the default) or x86_64-apple-darwin.
# Output goes to target/macos (a directory of its own: std is built per
# target and kept there).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/target/macos/tools
export CARGO_TARGET_DIR="$root/target/macos"

install() {
    # Debian's toolchain (rustc 1.96 with std's source, for -Zbuild-std),
    # and zig from PyPI: the macOS C headers and libSystem stubs.
    if ! dpkg -s cargo-web rust-web-src rust-web-clippy >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            rustc-web cargo-web rust-web-src rust-web-clippy >/dev/null
    fi
    # file(1) shows what was linked; pip brings zig.
    if ! command -v file >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq file python3-pip >/dev/null
    fi
    if ! python3 -c 'import ziglang' 2>/dev/null; then
        python3 -m pip install -q --break-system-packages ziglang
    fi
    zig=$(python3 -c 'import ziglang,os;print(os.path.dirname(ziglang.__file__))')/zig
    mkdir -p "$tools/stubs"
    for arch in aarch64 x86_64; do
        for lang in cc c++; do
            # cc-rs passes --target=arm64-apple-macosx, which zig rejects:
            # the wrapper names the target itself.
            cat >"$tools/$lang-$arch" <<EOF
#!/bin/sh
skip=
for a do
    shift
    if [ -n "\$skip" ]; then skip=; continue; fi
    case "\$a" in
        --target=*) continue ;;
        -target) skip=1; continue ;;
    esac
    set -- "\$@" "\$a"
done
exec "$zig" $lang -target $arch-macos "\$@"
EOF
            chmod +x "$tools/$lang-$arch"
        done
        # The linker: the compiler plus the stubs (an empty libiconv that
        # std names, and the frameworks dependencies name, whose symbols
        # dyld binds at run time).
        cat >"$tools/ld-$arch" <<EOF
#!/bin/sh
exec "$tools/cc-$arch" -L"$tools/stubs" -F"$tools/stubs/Frameworks" -Wl,-undefined,dynamic_lookup "\$@"
EOF
        chmod +x "$tools/ld-$arch"
    done
    printf '#!/bin/sh\nexec "%s" ar "$@"\n' "$zig" >"$tools/ar"
    chmod +x "$tools/ar"
    [ -f "$tools/stubs/libiconv.a" ] || "$zig" ar rc "$tools/stubs/libiconv.a"
    for fw in CoreFoundation CoreServices Security ServiceManagement SystemConfiguration Foundation IOKit DiskArbitration; do
        d=$tools/stubs/Frameworks/$fw.framework
        mkdir -p "$d"
        cat >"$d/$fw.tbd" <<EOF
--- !tapi-tbd
tbd-version: 4
targets: [ x86_64-macos, arm64-macos ]
install-name: '/System/Library/Frameworks/$fw.framework/Versions/A/$fw'
current-version: 1
...
EOF
    done
    [ -f "$tools/stubs/libobjc.tbd" ] || cat >"$tools/stubs/libobjc.tbd" <<EOF
--- !tapi-tbd
tbd-version: 4
targets: [ x86_64-macos, arm64-macos ]
install-name: '/usr/lib/libobjc.A.dylib'
current-version: 228
...
EOF
}

env_for() {
    arch=${1%%-*}
    t=$(echo "$1" | tr - _)
    T=$(echo "$t" | tr a-z A-Z)
    export RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1
    # Debian's cargo-clippy and clippy-driver before rustup's.
    export PATH="/usr/bin:$PATH"
    export "CC_$t=$tools/cc-$arch" "CXX_$t=$tools/c++-$arch" "AR_$t=$tools/ar"
    export "CARGO_TARGET_${T}_LINKER=$tools/ld-$arch"
    # aws-lc and ring look for a macOS SDK only to find headers zig has.
    export MACOSX_DEPLOYMENT_TARGET=11.0
}

cargo_for() {
    target=$1
    shift
    env_for "$target"
    sub=$1
    shift
    /usr/bin/cargo "$sub" --locked --target "$target" -Zbuild-std=std,panic_abort "$@"
}

# Links the capsule binary (profile `macos`: unoptimised, no debug info)
# and shows what it is; fails unless it is a Mach-O executable for the
# target's architecture.
link() {
    cargo_for "$1" build --profile macos -p capsule --bin capsule
    bin="$CARGO_TARGET_DIR/$1/macos/capsule"
    what=$(file -b "$bin")
    echo "$bin: $what"
    case "$1" in
    aarch64-*) want="Mach-O 64-bit*arm64*" ;;
    *) want="Mach-O 64-bit*x86_64*" ;;
    esac
    # shellcheck disable=SC2254
    case "$what" in
    $want) ;;
    *) echo "not a Mach-O executable for $1" >&2; exit 1 ;;
    esac
}

cmd=${1:-all}
[ $# -gt 0 ] && shift
case "$cmd" in
install) install ;;
check | clippy | build)
    install
    [ $# -gt 0 ] || set -- aarch64-apple-darwin
    for target do
        case "$cmd" in
        check) cargo_for "$target" check --workspace --all-targets ;;
        clippy) cargo_for "$target" clippy --workspace --all-targets -- -D warnings ;;
        build) link "$target" ;;
        esac
    done
    ;;
all)
    install
    start=$(date +%s)
    cargo_for x86_64-apple-darwin clippy --workspace --all-targets -- -D warnings
    echo "macOS: clippy clean for x86_64-apple-darwin ($(($(date +%s) - start)) s)"
    start=$(date +%s)
    link aarch64-apple-darwin
    echo "macOS: linked for aarch64-apple-darwin ($(($(date +%s) - start)) s)"
    ;;
*)
    sed -n 2,14p "$0" >&2
    exit 2
    ;;
esac
