# shellcheck shell=bash
# interop/lib/blockwire.sh — start and stop blockwire's own target daemon for interop tests.
#
# Source it (it sources peers.sh too):   . "$(dirname "$0")/lib/blockwire.sh"
#
# Functions (all waits are bounded with `timeout`):
#   blockwire_bin                      print the path of the release `blockwire-target`
#                                      binary, building it (cargo build --release -p
#                                      blockwire-mgmt) if it is missing. $BLOCKWIRE_BIN
#                                      overrides the path (no build then).
#   blockwire_cli                      the same for the release `blockwire` CLI (the
#                                      initiator: cargo build --release -p
#                                      blockwire-initiator); $BLOCKWIRE_CLI overrides it.
#   start_blockwire PORT DIR [CONFIG]  start `blockwire-target --listen 127.0.0.1:PORT
#                                      [--config CONFIG]`, log to DIR/blockwire-PORT.log,
#                                      wait (<= 20 s) until the port accepts, print the PID
#   stop_blockwire PID                 SIGTERM, wait up to 10 s for a clean exit and report
#                                      the exit code on stderr, then SIGKILL. Returns the
#                                      daemon's exit code (0 = clean shutdown; 137 when it
#                                      had to be killed; 0 when it was already gone).
#   blockwire_metric_sum PORT METRIC [SELECTOR...]
#                                      the sum of METRIC's samples on the daemon's metrics
#                                      endpoint 127.0.0.1:PORT (its [metrics] listen), as an
#                                      integer. A SELECTOR is labels a sample must all carry,
#                                      comma-separated ('path="sendfile",kind="sent_from_user"');
#                                      a sample counts when it matches any SELECTOR (none
#                                      given: every sample of METRIC).
#
# Usage:
#   pid=$(start_blockwire "$port" "$tmp" "$tmp/target.toml")
#   trap 'stop_blockwire "$pid" || true' EXIT

_bw_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=peers.sh
. "$_bw_lib_dir/peers.sh"
_bw_repo=$(cd "$_bw_lib_dir/../.." && pwd)

# Where start_blockwire's wrapper leaves each daemon's exit code, keyed by PID.
_bw_state=${TMPDIR:-/tmp}/blockwire-interop-state
mkdir -p "$_bw_state"

# _bw_release OVERRIDE NAME PACKAGE — prints OVERRIDE if set, else the release binary NAME,
# built (cargo build --release -p PACKAGE) if it is missing.
_bw_release() {
    if [ -n "$1" ]; then
        echo "$1"
        return 0
    fi
    # .cargo/config.toml puts cargo's output in build/ (the folder target/ is a crate).
    local bin="${CARGO_TARGET_DIR:-$_bw_repo/build}/release/$2"
    if [ ! -x "$bin" ]; then
        echo "$2: $bin missing, building it (release)" >&2
        (cd "$_bw_repo" && timeout 1800 cargo build --release -p "$3" >&2) || {
            echo "$2: release build failed" >&2
            return 1
        }
    fi
    echo "$bin"
}

blockwire_bin() { _bw_release "${BLOCKWIRE_BIN:-}" blockwire-target blockwire-mgmt; }
blockwire_cli() { _bw_release "${BLOCKWIRE_CLI:-}" blockwire blockwire-initiator; }

# loopback_pair_bin — prints the path of target/examples/loopback_pair (the bare loopback sender
# and receiver the 1 MiB benchmarks compare against), built (release) first: cargo rebuilds it
# only if its sources changed.
loopback_pair_bin() {
    (cd "$_bw_repo" && timeout 1800 cargo build -q --release -p blockwire-target --example loopback_pair >&2) || {
        echo "loopback_pair: building the example failed" >&2
        return 1
    }
    echo "${CARGO_TARGET_DIR:-$_bw_repo/build}/release/examples/loopback_pair"
}

# start_blockwire PORT DIR [CONFIG] — prints the daemon's PID.
start_blockwire() {
    local port=$1 dir=$2 config=${3:-} bin pid log
    bin=$(blockwire_bin) || return 1
    mkdir -p "$dir"
    log="$dir/blockwire-$port.log"
    local -a args=(--listen "127.0.0.1:$port")
    [ -n "$config" ] && args+=(--config "$config")
    rm -f "$dir/blockwire-$port.pid"
    # A wrapper subshell starts the daemon, publishes its PID and records its exit code when
    # it ends: the caller runs us inside $(...), so it could never `wait` for the daemon.
    # All output goes to files so that $(...) does not wait for the daemon's stdout.
    (
        "$bin" "${args[@]}" >"$log" 2>&1 </dev/null &
        p=$!
        echo "$p" >"$dir/blockwire-$port.pid"
        rm -f "$_bw_state/exit.$p"
        if wait "$p"; then rc=0; else rc=$?; fi
        echo "$rc" >"$_bw_state/exit.$p"
    ) >/dev/null 2>&1 </dev/null &
    # Wait for the PID file, then for the portal (bounded); give up if the daemon dies.
    if ! timeout 5 bash -c 'until [ -s "$1" ]; do sleep 0.05; done' _ "$dir/blockwire-$port.pid"; then
        echo "start_blockwire: no PID for port $port" >&2
        return 1
    fi
    pid=$(cat "$dir/blockwire-$port.pid")
    if ! timeout 20 bash -c '
            until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
                kill -0 "$2" 2>/dev/null || exit 1
                sleep 0.05
            done' _ "$port" "$pid"; then
        echo "start_blockwire: blockwire-target on port $port did not come up; log $log:" >&2
        sed 's/^/    /' "$log" | tail -n 20 >&2
        stop_blockwire "$pid" >/dev/null 2>&1 || true
        return 1
    fi
    echo "$pid"
}

# stop_blockwire PID — SIGTERM, <= 10 s for a clean exit, then SIGKILL; returns the exit code.
stop_blockwire() {
    local pid=$1 rc
    [ -n "$pid" ] || return 0
    if ! kill -TERM "$pid" 2>/dev/null; then
        rm -f "$_bw_state/exit.$pid"
        return 0
    fi
    if ! _wait_gone 10 "$pid"; then
        echo "stop_blockwire: blockwire-target $pid still running 10 s after SIGTERM: SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        _wait_gone 5 "$pid" || true
    fi
    wait "$pid" 2>/dev/null || true
    # The wrapper of start_blockwire writes the exit code right after the daemon ends.
    timeout 3 bash -c 'until [ -s "$1" ]; do sleep 0.05; done' _ "$_bw_state/exit.$pid" || true
    rc=$(cat "$_bw_state/exit.$pid" 2>/dev/null || echo unknown)
    rm -f "$_bw_state/exit.$pid"
    echo "stop_blockwire: blockwire-target $pid exited with code $rc" >&2
    [ "$rc" = 0 ] && return 0
    [ "$rc" = unknown ] && return 0
    return "$rc"
}

# blockwire_config_file FILE IQN SIZE [ALLOW...] — write a minimal one-target config: one
# portal group (the listen address is replaced by --listen), RAM LUN 0 of SIZE ("1G"),
# ACL = the ALLOW initiator names (none given: any initiator).
blockwire_config_file() {
    local file=$1 iqn=$2 size=$3
    shift 3
    _bw_one_lun_config "$file" "$iqn" 'backstore = "ram"' "$size" "$@"
}

# blockwire_file_config FILE IQN PATH SIZE — the same, LUN 0 backed by the file PATH (created at
# SIZE if missing), any initiator.
blockwire_file_config() {
    _bw_one_lun_config "$1" "$2" "backstore = \"file\"
path = \"$3\"" "$4"
}

# blockwire_plain_and_protected_config FILE IQN DIR SIZE — two file LUNs of SIZE in DIR, the
# same but for T10 protection information: LUN 0 plain (DIR/plain.img), LUN 1
# `protection = "type1"` (DIR/protected.img, its tuples in a file beside it), any initiator;
# what interop/bench-protection.sh and bench/profile-protection.sh compare.
blockwire_plain_and_protected_config() {
    local file=$1 iqn=$2 dir=$3 size=$4
    blockwire_file_config "$file" "$iqn" "$dir/plain.img" "$size"
    cat >>"$file" <<EOF

[[target.lun]]
id = 1
backstore = "file"
path = "$dir/protected.img"
size = "$size"
protection = "type1"
EOF
}

# _bw_one_lun_config FILE IQN BACKSTORE_LINES SIZE [ALLOW...] — the body of the two above.
_bw_one_lun_config() {
    local file=$1 iqn=$2 backstore=$3 size=$4
    shift 4
    {
        echo '# generated by interop/lib/blockwire.sh'
        echo '[[portal_group]]'
        echo 'tag = 1'
        echo 'listen = ["127.0.0.1:3260"]'
        echo
        echo '[[target]]'
        echo "name = \"$iqn\""
        if [ $# -gt 0 ]; then
            local a sep="" list=""
            for a in "$@"; do list+="$sep\"$a\""; sep=", "; done
            echo "allow = [$list]"
        fi
        echo
        echo '[[target.lun]]'
        echo 'id = 0'
        echo "$backstore"
        echo "size = \"$size\""
    } >"$file"
}

# blockwire_bench_rates WHAT SECS ARGS... — runs `blockwire bench ARGS... --time SECSs` (bounded
# at SECS + 60 s) and prints "MB/s IOPS" of the run; on failure says WHAT failed and returns 1.
blockwire_bench_rates() {
    local what=$1 secs=$2 out
    shift 2
    out=$(timeout $((secs + 60)) "$(blockwire_cli)" bench "$@" --time "${secs}s" 2>&1) || {
        echo "FAIL: blockwire bench ($what): $out" >&2
        return 1
    }
    python3 - "$out" <<'PY'
import re, sys
t = sys.argv[1]
mb = re.search(r"\bMB/s=([0-9.]+)", t)
io = re.search(r"\bIOPS=([0-9.]+)", t)
if not (mb and io):
    sys.exit(f"cannot read MB/s and IOPS from: {t!r}")
print(mb.group(1), io.group(1))
PY
}

# The two initiator names iscsi-test-cu logs in with (the reservation tests use both).
LIBISCSI_TEST_INITIATOR=iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test
LIBISCSI_TEST_INITIATOR2=iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2

# blockwire_metric_sum PORT METRIC [SELECTOR...] — see the header. Labels are compared as
# parsed pairs, so their order in the exposition does not matter.
blockwire_metric_sum() {
    local port=$1 metric=$2
    shift 2
    python3 - "http://127.0.0.1:$port/metrics" "$metric" "$@" <<'PY'
import re, sys, urllib.request

PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
url, metric, selectors = sys.argv[1], sys.argv[2], sys.argv[3:]
wanted = [set(PAIR.findall(s)) for s in selectors]
for given, parsed in zip(selectors, wanted):
    if not parsed:
        sys.exit(f"blockwire_metric_sum: selector {given!r} has no label=\"value\" pair")
total = 0.0
for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
    if line.startswith("#"):
        continue
    name, _, rest = line.partition("{")
    if name == metric:
        labels, _, value = rest.partition("} ")
    elif line.startswith(metric + " "):
        labels, value = "", line[len(metric) + 1:]
    else:
        continue
    have = set(PAIR.findall(labels))
    if not wanted or any(w <= have for w in wanted):
        total += float(value.split()[0])
print(f"{total:.0f}")
PY
}
