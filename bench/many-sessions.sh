#!/usr/bin/env bash
# bench/many-sessions.sh — many sessions on one blockwire-target: SESSIONS (default 1000) log in,
# BUSY (default 100) of them run 4 KiB random READs at QD1 for SECS (default 10) while the rest
# idle. Prints the daemon's memory per idle session, login time, READ latency percentiles and
# IOPS under that load, and whether every session still answers (tests/examples/many_sessions.rs).
# 1 GiB RAM LUN, release build, client and target on this machine. Results:
# bench/many-sessions-results.txt. BLOCKWIRE_BIN: another blockwire-target binary (a build from
# before a change); BW_BUSY_POLL_US, BW_CONNECTION_THREADS: the daemon's [fabric] busy_poll_us
# and connection_threads (unset: their defaults).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib.sh"
SESSIONS=${SESSIONS:-1000} BUSY=${BUSY:-100} SECS=${SECS:-10}
tmp=$(mktemp -d)
pid=""
trap 'stop_daemon; rm -rf "$tmp"' EXIT

build_release
(cd "$repo" && cargo build --release -q -p blockwire-tests --example many_sessions)
port=$(free_port)
IQN=iqn.2026-11.io.blockwire:many
cat >"$tmp/target.toml" <<EOT
[fabric]
queue_depth = 32
${BW_BUSY_POLL_US:+busy_poll_us = $BW_BUSY_POLL_US}
${BW_CONNECTION_THREADS:+connection_threads = $BW_CONNECTION_THREADS}

[[portal_group]]
tag = 1
listen = ["127.0.0.1:$port"]

[[target]]
name = "$IQN"
[[target.lun]]
id = 0
backstore = "ram"
size = "1G"
EOT
wait_for_rustc
# The daemon starts with this shell's soft open-file limit and raises its own; the client here
# needs one socket per session too.
start_daemon "$tmp/target.log"
ulimit -n "$(ulimit -Hn)"
echo "machine: $(nproc) CPUs, $(uname -r); blockwire-target pid $pid, $(git -C "$repo" rev-parse --short HEAD)"
echo "open files: $(ulimit -n) here, $(awk '/Max open files/ {print $4}' "/proc/$pid/limits") in the target"
timeout $((SECS + 300)) "$build/examples/many_sessions" --portal "127.0.0.1:$port" --target "$IQN" \
    --pid "$pid" --sessions "$SESSIONS" --busy "$BUSY" --secs "$SECS"
