#!/usr/bin/env bash
# cross_build.sh - check that the portable C path builds and runs without the x86 kernels
# (`make cross-check`; not part of .ci/run).
#
#   1. ARCH=generic with the host compiler into build-generic/: the x86_*.c files left out,
#      DSV4_HAVE_X86=0, then the kernels and forward test groups natively (scalar only).
#   2. A cross compiler (CROSS_CC, default aarch64-linux-gnu-gcc) into build-aarch64/ with
#      -Werror: the library and tool objects, and dsv4 and run_tests when the target's
#      libjansson, libonig, libmicrohttpd and libutf8proc are installed. The host's headers serve (the
#      cross compiler searches /usr/include), so the runtime packages are enough (Debian:
#      dpkg --add-architecture arm64; apt-get update; apt-get install libjansson4:arm64
#      libonig5:arm64 libmicrohttpd12:arm64 libutf8proc2:arm64); the linker finds them through .so links made
#      here. Not the -dev:arm64 packages: libonig-dev:arm64 replaces libonig-dev:amd64, and
#      with two instances of libjansson-dev `dpkg -s libjansson-dev` fails, which
#      tools/install_deps.sh reads as missing.
#   3. With qemu-aarch64 (Debian: qemu-user): `dsv4 ops` and the test groups (or GROUP/TEST)
#      of QEMU_TESTS (default: kernels) under it, as a Cortex-A57 (ARMv8.0: the neon level
#      may use nothing later), with DSV4_TEST_LIGHT=1: the slowest model tests (golden,
#      v41_fwd) take the neon level and one chunking of the exact path (tests/test.h,
#      test_light); the native run takes every level and chunking.
#
#   tools/cross_build.sh             all three (`make cross-check`)
#   tools/cross_build.sh --aarch64   2 and 3 only, and a missing cross compiler, target
#                                    library or qemu is an error (`make cross-aarch64`, CI;
#                                    tools/install_deps.sh cross installs them)
#
# Exit 1 on the first failure; otherwise a missing cross compiler or qemu is reported and skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
ONLY_AARCH64=0
[ "${1:-}" = --aarch64 ] && ONLY_AARCH64=1
QEMU_TESTS=${QEMU_TESTS:-kernels}
# $1: what is missing; an error with --aarch64, else a note and exit 0
missing() {
    echo "== $1"
    [ "$ONLY_AARCH64" = 1 ] && exit 1
    exit 0
}

CROSS_CC=${CROSS_CC:-aarch64-linux-gnu-gcc}
JOBS=$(nproc 2>/dev/null || echo 2)

if [ "$ONLY_AARCH64" = 0 ]; then
    echo "== portable path on the host compiler (ARCH=generic)"
    make --no-print-directory -j"$JOBS" ARCH=generic BUILD=build-generic WERROR=1 build-generic/dsv4 build-generic/run_tests
    DSV4_BIN="$PWD/build-generic/dsv4" build-generic/run_tests kernels forward
fi

if ! command -v "$CROSS_CC" >/dev/null; then
    missing "$CROSS_CC not found (Debian: apt-get install gcc-aarch64-linux-gnu): cross build skipped"
fi
echo "== cross build with $CROSS_CC"
LINKDIR="$PWD/build-aarch64/linklibs"
LIBDIR="/usr/lib/$("$CROSS_CC" -print-multiarch 2>/dev/null || echo aarch64-linux-gnu)"
mkdir -p "$LINKDIR"
for l in jansson onig microhttpd utf8proc; do
    so=$(ls "$LIBDIR/lib$l.so."[0-9]* 2>/dev/null | head -n 1 || true)
    [ -e "$LIBDIR/lib$l.so" ] || [ -z "$so" ] || ln -sf "$so" "$LINKDIR/lib$l.so"
done
# LDFLAGS from the environment: the Makefile appends its own to it
export LDFLAGS="-L$LINKDIR"
XMAKE=(make --no-print-directory -j"$JOBS" CC="$CROSS_CC" BUILD=build-aarch64 WERROR=1)
if ! "${XMAKE[@]}" build-aarch64/dsv4 build-aarch64/run_tests; then
    # Without the target's libraries nothing links; every object must still compile.
    echo "== link failed (target libraries missing?): compiling the library, support and tool objects only"
    "${XMAKE[@]}" build-aarch64/libdsv4.a build-aarch64/libdsv4-support.a
    "${XMAKE[@]}" $(find tools -maxdepth 1 -name '*.c' | sed 's|^\(.*\)\.c$|build-aarch64/\1.o|')
    missing "objects built; no binaries to run"
fi

if ! command -v qemu-aarch64 >/dev/null; then
    missing "qemu-aarch64 not found (Debian: apt-get install qemu-user): nothing run"
fi
# The sysroot for qemu: / when the multiarch arm64 libraries are installed. Debian 12's
# /usr/aarch64-linux-gnu holds an older libc than libc6:arm64, and its ld.so with the newer
# libc.so.6 (found through /etc/ld.so.cache) hangs at the first pthread_create.
QROOT=/usr/aarch64-linux-gnu
[ -e /lib/ld-linux-aarch64.so.1 ] && QROOT=/
Q=(qemu-aarch64 -cpu cortex-a57 -L "$QROOT")
echo "== under ${Q[*]}: $QEMU_TESTS"
"${Q[@]}" build-aarch64/dsv4 ops
# shellcheck disable=SC2086 # QEMU_TESTS is a list of names
DSV4_TEST_LIGHT=1 DSV4_BIN="${Q[*]} $PWD/build-aarch64/dsv4" "${Q[@]}" build-aarch64/run_tests --strict $QEMU_TESTS
echo "== cross check passed"
