#!/bin/bash
# interop/test-initiator-ublk.sh — the ublk front end (`blockwire ublk`, cargo feature `ublk`).
#
#   cargo build -p blockwire-initiator --features ublk     (libublk; bindgen needs libclang-dev)
#   without /dev/ublk-control: `blockwire ublk` must fail at once (exit 1, no login attempted)
#     with the message naming /dev/ublk-control — the only check possible on such a kernel
#   with /dev/ublk-control: blockwire-target on a free port, `blockwire ublk` LUN 0, wait for
#     the /dev/ublkbN it prints, write 16 MiB of random data with O_DIRECT, read it back,
#     compare SHA-256, SIGTERM (device deleted, flush, logout)
#
# Prints each step; exits 1 on failure. Bounded with timeout; cleans up in a trap.
set -euo pipefail
if [ -z "${_BW_UBLK_TIMED:-}" ]; then
    export _BW_UBLK_TIMED=1
    exec timeout -k 30 "${BW_UBLK_TIMEOUT:-900}" "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib/blockwire.sh"

step() { printf '==== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }

tmp=$(mktemp -d /tmp/bw-ublk.XXXXXX)
target_pid="" ublk_pid=""
cleanup() {
    set +e
    [ -n "$ublk_pid" ] && stop_pid "$ublk_pid"
    [ -n "$target_pid" ] && stop_blockwire "$target_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo interrupted; exit 1' INT TERM

step "cargo build -p blockwire-initiator --features ublk"
(cd "$repo" && cargo build -q -p blockwire-initiator --features ublk) || fail "build with --features ublk"
bw=${CARGO_TARGET_DIR:-$repo/build}/debug/blockwire

if [ ! -e /dev/ublk-control ]; then
    step "blockwire ublk without /dev/ublk-control (kernel $(uname -r) has no ublk driver)"
    rc=0
    # A portal nobody listens on: the command must fail before any connection attempt.
    timeout 20 "$bw" ublk -p 127.0.0.1:1 -T iqn.2026-11.io.blockwire:default \
        >"$tmp/out" 2>&1 || rc=$?
    sed 's/^/    /' "$tmp/out"
    [ "$rc" = 1 ] || fail "expected exit 1, got $rc"
    grep -q "ublk is not available: /dev/ublk-control is missing" "$tmp/out" ||
        fail "the message does not name /dev/ublk-control"
    ! grep -qi "connect\|login" "$tmp/out" || fail "it tried to log in first"
    step "blockwire ublk --qd 600 under a hard open-files limit of 300: refused by name"
    # Each tag holds a pipe; past the limit a tag never fetched and the start hung.
    rc=0
    (ulimit -Sn 300 && ulimit -Hn 300 &&
        exec timeout 20 "$bw" ublk -p 127.0.0.1:1 -T iqn.2026-11.io.blockwire:default --qd 600) \
        >"$tmp/out" 2>&1 || rc=$?
    sed 's/^/    /' "$tmp/out"
    [ "$rc" = 1 ] || fail "expected exit 1, got $rc"
    grep -q -- "--qd 600 needs about 1264 open files" "$tmp/out" || fail "the message does not name --qd"
    step "blockwire ublk --qd 200 under a soft limit of 300 (hard $(ulimit -Hn)): the soft limit is raised"
    rc=0
    (ulimit -Sn 300 && exec timeout 20 "$bw" ublk -p 127.0.0.1:1 -T iqn.2026-11.io.blockwire:default --qd 200) \
        >"$tmp/out" 2>&1 || rc=$?
    sed 's/^/    /' "$tmp/out"
    grep -q "ublk is not available" "$tmp/out" || fail "it did not get as far as the driver check"
    echo "PASS: test-initiator-ublk (no ublk driver here: clear failure checked)"
    exit 0
fi

port=$(free_port)
step "start blockwire-target on 127.0.0.1:$port"
target_pid=$(start_blockwire "$port" "$tmp") || fail "blockwire-target did not start"
step "blockwire ublk -p 127.0.0.1:$port -l 0"
"$bw" ublk -p "127.0.0.1:$port" -T iqn.2026-11.io.blockwire:default -l 0 >"$tmp/ublk.log" 2>&1 &
ublk_pid=$!
timeout 30 bash -c 'until grep -q "^ublk device /dev/ublkb" "$1"; do kill -0 "$2" || exit 1; sleep 0.2; done' \
    _ "$tmp/ublk.log" "$ublk_pid" || { cat "$tmp/ublk.log"; fail "no ublk device"; }
dev=$(sed -n 's/^ublk device \(\/dev\/ublkb[0-9]*\) .*/\1/p' "$tmp/ublk.log")
sed 's/^/    /' "$tmp/ublk.log"
timeout 10 bash -c 'until [ -b "$1" ]; do sleep 0.1; done' _ "$dev" || fail "$dev did not appear"
step "16 MiB random write + read-back on $dev"
head -c $((16 << 20)) /dev/urandom >"$tmp/data"
dd if="$tmp/data" of="$dev" bs=1M oflag=direct status=none || fail "write"
dd if="$dev" of="$tmp/back" bs=1M count=16 iflag=direct status=none || fail "read"
a=$(sha256sum <"$tmp/data" | cut -d' ' -f1) b=$(sha256sum <"$tmp/back" | cut -d' ' -f1)
echo "    written $a"
echo "    read    $b"
[ "$a" = "$b" ] || fail "checksums differ"
step "stop blockwire ublk"
kill -TERM "$ublk_pid"
rc=0
timeout 30 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.1; done' _ "$ublk_pid" || fail "still running"
wait "$ublk_pid" || rc=$?
ublk_pid=""
sed 's/^/    /' "$tmp/ublk.log" | tail -n 2
[ "$rc" = 0 ] || fail "blockwire ublk exited $rc"
echo "PASS: test-initiator-ublk"
