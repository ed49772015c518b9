# bench/lib.sh — shell functions shared by the bench scripts that run a blockwire-target daemon
# (send-paths.sh, sync-write.sh, striped.sh). Sourced, not run: `. "$here/lib.sh"` after `repo` is
# set. It defines `build` (the release directory) and uses the globals `pid` (the daemon's PID,
# empty when none runs) and `tmp` (the script's scratch directory).

build=${CARGO_TARGET_DIR:-$repo/build}/release

# Builds the release blockwire-target and blockwire CLI; if that fails, goes on with the binaries
# already in $build (with a warning), or exits when there are none.
build_release() {
    echo "building blockwire-target and the blockwire CLI (release)" >&2
    if ! (cd "$repo" && cargo build --release -q -p blockwire-mgmt -p blockwire-initiator >&2); then
        [ -x "$build/blockwire-target" ] && [ -x "$build/blockwire" ] ||
            { echo "release build failed and no binaries in $build" >&2; exit 1; }
        echo "WARNING: release build failed; using the binaries already in $build" >&2
    fi
}

# Compiles beside a benchmark distort its numbers: waits (at most 5 min) for rustc to finish.
wait_for_rustc() {
    if pgrep -x rustc >/dev/null; then
        echo "waiting (at most 5 min) for a running cargo build (rustc) to finish..." >&2
        timeout 300 bash -c 'while pgrep -x rustc >/dev/null; do sleep 5; done' ||
            echo "WARNING: rustc still running; numbers will be noisy" >&2
    fi
}

# A free TCP port on 127.0.0.1.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Fills $tmp/l<n>.img for each LUN number given with SIZE_MIB MiB of random data (64 MiB of
# /dev/urandom repeated: holes would read for free), then syncs.
fill_random() { # lun...
    local l i
    head -c 64M /dev/urandom >"$tmp/rand"
    for l in "$@"; do
        for ((i = 0; i < SIZE_MIB; i += 64)); do cat "$tmp/rand"; done | head -c "${SIZE_MIB}M" >"$tmp/l$l.img"
    done
    rm "$tmp/rand"
    sync
}

# Strips ANSI colours (the daemon's log).
plain() { sed 's/\x1b\[[0-9;]*m//g'; }

# Starts the release daemon with `--config $tmp/target.toml` and the extra flags, logging at info
# level to the file LOG; sets pid. Waits (at most 10 s) for it to listen; exits on failure with
# its log.
# Starts the daemon (BLOCKWIRE_BIN: another blockwire-target binary, e.g. a build from before a
# change) on $tmp/target.toml with the given flags, logging to LOG; waits until it listens.
start_daemon() { # log flags...
    local log=$1
    shift
    BLOCKWIRE_LOG=info "${BLOCKWIRE_BIN:-$build/blockwire-target}" --config "$tmp/target.toml" "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
        grep -q "reach it with" "$log" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || { plain <"$log" >&2; exit 1; }
        sleep 0.1
    done
    grep -q "reach it with" "$log" || { echo "target did not start" >&2; plain <"$log" >&2; exit 1; }
}

# SIGTERM by PID, then at most 15 s to flush, log its shutdown summary and exit, then SIGKILL.
stop_daemon() {
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
}

# utime + stime of the daemon (all threads), in clock ticks.
cpu_ticks() {
    awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$pid/stat"
}

# Runs `blockwire bench` against LUN of $IQN on 127.0.0.1:$port with the remaining flags
# (bounded: SECS + 60 s) and sets ios and mbps from its output; exits with the output on failure.
# The caller reads cpu_ticks around it.
bench_cli() { # lun flags...
    local lun=$1 out
    shift
    out=$(timeout $((SECS + 60)) "$build/blockwire" bench -p "127.0.0.1:$port" -T "$IQN" -l "$lun" \
        "$@" --time "${SECS}s") ||
        { echo "blockwire bench failed on LUN $lun ($*):" >&2; echo "$out" >&2; exit 1; }
    ios=$(echo "$out" | sed -n 's/^ios=\([0-9]*\).*/\1/p')
    mbps=$(echo "$out" | sed -n 's/.*MB\/s=\([0-9.]*\).*/\1/p' | head -1)
    [ -n "$ios" ] && [ -n "$mbps" ] || { echo "no ios/MB/s from blockwire bench:" >&2; echo "$out" >&2; exit 1; }
}
