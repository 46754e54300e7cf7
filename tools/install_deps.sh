#!/bin/sh
# install_deps.sh - installs what building and testing dsv4 need, when it is missing.
#
#   tools/install_deps.sh build       Debian packages to build dsv4 (make demo)
#   tools/install_deps.sh test        those, plus node and npm for the reference tests,
#                                     universal-ctags for the house test, systemd (its
#                                     systemd-analyze) for the deploy test, chromium for
#                                     the chat page's browser test (tests/webui), and the Vulkan
#                                     loader, headers, glslc and Mesa's drivers (lavapipe: a
#                                     Vulkan device on the CPU) for the vulkan group
#   tools/install_deps.sh npm RUNNER  `npm ci` in each npm directory the test runner reports
#                                     missing or stale against its package-lock.json
#   tools/install_deps.sh ci          everything CI runs: test packages, clang and its fuzzer
#                                     runtime, valgrind
#   tools/install_deps.sh cross       the aarch64 cross compiler, qemu-user and the arm64
#                                     runtime libraries (multiarch) for make cross-aarch64
#
# Debian packages are installed only as root with apt-get; otherwise the command that
# installs them is printed. Build packages that are missing stop the build (exit 1); what
# only some tests need is left to the test runner, which reports those tests as skipped with
# the same fix. NO_INSTALL=1 installs nothing and only reports.
set -u

BUILD_PKGS="build-essential pkg-config libjansson-dev libonig-dev libmicrohttpd-dev libutf8proc-dev"
# the house test's function lengths (tools/func_lengths.sh); systemd-analyze, which the deploy
# group runs on deploy/systemd/dsv4.service (a container needs only the package, not systemd
# running); curl: deploy/rollout.sh reads the canary's /metrics with it (loadtest/rollout_phases);
# chromium: the browser of the chat page test; Open MPI: the expert-parallel build and its tests (mpi group)
TEST_PKGS="universal-ctags systemd curl chromium openmpi-bin libopenmpi-dev"
# the Vulkan backend (make detects them) and a device to test it on: lavapipe
VK_PKGS="libvulkan-dev glslc mesa-vulkan-drivers"
CI_PKGS="clang libclang-rt-14-dev valgrind ca-certificates"
# libc6-dev-arm64-cross: only a Recommends of gcc-aarch64-linux-gnu, which apt_install skips
CROSS_PKGS="gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
# runtime packages only: the host's headers serve the cross compiler (tools/cross_build.sh)
ARM64_PKGS="libc6:arm64 libjansson4:arm64 libonig5:arm64 libmicrohttpd12:arm64 libutf8proc2:arm64"

can_apt() {
    [ "${NO_INSTALL:-0}" != 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1
}

missing_debs() {
    command -v dpkg >/dev/null 2>&1 || return 0
    arch=$(dpkg --print-architecture)
    # the native (or arch-independent) package: with arm64 packages also installed, `dpkg -s NAME`
    # is ambiguous or finds the foreign one
    for p in "$@"; do
        dpkg -s "$p:$arch" >/dev/null 2>&1 || dpkg -s "$p:all" >/dev/null 2>&1 || printf '%s ' "$p"
    done
}

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq || return 1
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# $1: what for, $2: required (1: exit 1 when it cannot be installed), rest: packages
debs() {
    what=$1 required=$2
    shift 2
    miss=$(missing_debs "$@")
    [ -z "$miss" ] && return 0
    if can_apt; then
        echo "installing $miss($what)" >&2
        apt_install $miss && return 0
        echo "install_deps: apt-get install $miss failed" >&2
    else
        echo "$what needs: $miss" >&2
        echo "  fix: sudo apt-get install $miss" >&2
    fi
    [ "$required" = 1 ] && exit 1
    return 0
}

node_tools() {
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 && return 0
    if can_apt; then
        echo "installing nodejs npm (the reference tests)" >&2
        apt_install nodejs npm && return 0
    fi
    echo "the tokenizer, OpenAI-client and chat page tests need node and npm (they will be skipped)" >&2
    echo "  fix: sudo apt-get install nodejs npm" >&2
}

npm_dirs() {
    runner=$1
    dirs=$("$runner" --missing) || exit 1
    [ -z "$dirs" ] && return 0
    if ! command -v npm >/dev/null 2>&1; then
        return 0 # node_tools said so; the runner skips those tests with the fix
    fi
    for d in $dirs; do
        if [ "${NO_INSTALL:-0}" = 1 ]; then
            echo "not installing the npm packages of $d (NO_INSTALL=1): the tests that need them will be skipped" >&2
            continue
        fi
        echo "npm ci --prefix $d (pinned by $d/package-lock.json)" >&2
        # bounded: an unreachable registry fails in about a minute instead of npm's default 5
        log=$(mktemp)
        if ! npm ci --prefix "$d" --no-audit --no-fund --loglevel=error \
                --fetch-retries=1 --fetch-timeout=30000 >"$log" 2>&1; then
            grep -m1 -i "error" "$log" >&2
            echo "install_deps: npm ci --prefix $d failed: the tests that need it will be skipped" >&2
        fi
        rm -f "$log"
    done
}

# The arm64 libraries through multiarch (dpkg --add-architecture arm64), as root.
arm64_libs() {
    miss=""
    for p in $ARM64_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || miss="$miss$p "; done
    [ -z "$miss" ] && return 0
    if can_apt; then
        echo "installing $miss(the aarch64 tests under qemu)" >&2
        dpkg --add-architecture arm64 && apt_updated=0 && apt_install $miss && return 0
        echo "install_deps: apt-get install $miss failed" >&2
    else
        echo "make cross-aarch64 needs: $miss" >&2
        echo "  fix: sudo dpkg --add-architecture arm64 && sudo apt-get update && sudo apt-get install $miss" >&2
    fi
    exit 1
}

case "${1:-}" in
build) debs "building dsv4" 1 $BUILD_PKGS ;;
test)  debs "building dsv4" 1 $BUILD_PKGS; debs "the tests" 0 $TEST_PKGS $VK_PKGS; node_tools ;;
npm)   npm_dirs "${2:?usage: install_deps.sh npm RUNNER}" ;;
ci)    debs "building dsv4" 1 $BUILD_PKGS; debs "CI" 1 $TEST_PKGS $VK_PKGS $CI_PKGS; node_tools ;;
cross) debs "building dsv4" 1 $BUILD_PKGS; debs "the aarch64 cross build" 1 $CROSS_PKGS; arm64_libs ;;
*)     echo "usage: tools/install_deps.sh build|test|ci|cross|npm RUNNER" >&2; exit 2 ;;
esac
