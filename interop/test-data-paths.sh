#!/usr/bin/env bash
# The `blockwire` CLI's --data-path against blockwire-target, all on this machine with the
# soft RDMA provider: `dd` writes 8 MiB of random data and reads them back (compared) and
# `bench` runs, over plain iSCSI (tcp), RDMA-assisted iSCSI (rdma: the target offers the
# offload key, the data move by RDMA) and iSER (RFC 7145, to the target's iSER listener).
# Each RDMA path must really be taken: the target logs the RDMA binding / the iSER login.
# Then the fallback: --data-path rdma against a target that offers no offload is told once
# and still moves correct data over TCP; and `mount` refuses an RDMA data path by name.
# Uses the release binaries (`cargo build --release -p blockwire-mgmt -p blockwire-initiator`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
. "$here/lib/peers.sh"
build=${CARGO_TARGET_DIR:-$root/build}
target_bin=$build/release/blockwire-target
cli=$build/release/blockwire
for b in "$target_bin" "$cli"; do
    [ -x "$b" ] || { echo "FAIL: no $b (cargo build --release -p blockwire-mgmt -p blockwire-initiator)"; exit 1; }
done

tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do stop_pid "$p" || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
failed=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=$((failed + 1)); }

IQN=iqn.2026-11.io.blockwire:data-paths
# start NAME FABRIC-LINES PORTAL-LINES: a daemon on a free port; sets PORT.
start() {
    local name=$1 fabric=$2 extra=$3
    PORT=$(free_port)
    cat >"$tmp/$name.toml" <<TOML
[fabric]
$fabric
[[portal_group]]
tag = 1
listen = ["127.0.0.1:$PORT"]
$extra
[[target]]
name = "$IQN"
[[target.lun]]
id = 0
backstore = "ram"
size = "64M"
TOML
    BLOCKWIRE_LOG=info "$target_bin" --config "$tmp/$name.toml" >"$tmp/$name.log" 2>&1 &
    pids+=($!)
    timeout 20 bash -c "until (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null; do sleep 0.1; done" ||
        { echo "FAIL: blockwire-target ($name) did not start"; cat "$tmp/$name.log"; exit 1; }
}

ISER_PORT=$(free_port)
start offload 'rdma_backend = "soft"
rdma_listen = "127.0.0.1:0"' "iser_listen = [\"127.0.0.1:$ISER_PORT\"]"
url="iscsi://127.0.0.1:$PORT/$IQN/0"
head -c $((8 << 20)) /dev/urandom >"$tmp/in"

# round_trip PATH URL SEEK: dd in, dd out, compare.
round_trip() {
    local path=$1 url=$2 seek=$3
    rm -f "$tmp/out"
    "$cli" --data-path "$path" --iser-portal "127.0.0.1:$ISER_PORT" dd if="$tmp/in" of="$url" bs=1M seek="$seek" status=none \
        2>"$tmp/dd-$path.err" &&
        "$cli" --data-path "$path" --iser-portal "127.0.0.1:$ISER_PORT" dd if="$url" of="$tmp/out" bs=1M skip="$seek" count=8 status=none \
            2>>"$tmp/dd-$path.err" &&
        cmp -s "$tmp/in" "$tmp/out"
}

for path in tcp rdma iser; do
    seek=$((RANDOM % 32))
    if round_trip "$path" "$url" "$seek"; then
        pass "dd --data-path $path: 8 MiB written at block $seek and read back identical"
    else
        fail "dd --data-path $path: $(tail -n 3 "$tmp/dd-$path.err" | tr '\n' ' ')"
    fi
    out=$("$cli" bench -p "127.0.0.1:$PORT" --data-path "$path" --iser-portal "127.0.0.1:$ISER_PORT" \
        --op write --bs 64k --qd 4 --time 1s 2>&1) &&
        grep -q "IOPS=" <<<"$out" && pass "bench --data-path $path: $(grep -o 'data-path=.*' <<<"$out") $(grep -o 'IOPS=[0-9]*' <<<"$out")" ||
        fail "bench --data-path $path: $out"
done
grep -q "did not take RDMA-assisted" "$tmp"/dd-rdma.err &&
    fail "the rdma path fell back to TCP: $(cat "$tmp/dd-rdma.err")" || pass "the rdma path was not refused"
n=$(grep -c "RDMA connection bound to session" "$tmp/offload.log" || true)
[ "$n" -ge 2 ] && pass "the target bound $n RDMA connections (dd, dd, bench)" ||
    fail "the target bound $n RDMA connections: $(grep -i rdma "$tmp/offload.log" | tail -n 3 | tr '\n' ' ')"
n=$(grep -c "iSER login complete" "$tmp/offload.log" || true)
[ "$n" -ge 3 ] && pass "the target logged $n iSER logins (dd, dd, bench)" ||
    fail "the target logged $n iSER logins: $(grep -i iser "$tmp/offload.log" | tail -n 3 | tr '\n' ' ')"

# A target without the offload: told once, the data still right.
start plain '' ''
if round_trip rdma "iscsi://127.0.0.1:$PORT/$IQN/0" 3; then
    c=$(grep -c "did not take RDMA-assisted" "$tmp/dd-rdma.err" || true)
    [ "$c" = 2 ] && pass "rdma against a target without offload: said once per session, data identical over TCP" ||
        fail "rdma fallback said $c times: $(cat "$tmp/dd-rdma.err")"
else
    fail "rdma fallback round trip: $(tail -n 3 "$tmp/dd-rdma.err" | tr '\n' ' ')"
fi
mkdir -p "$tmp/mnt"
if out=$("$cli" --data-path iser mount -p "127.0.0.1:$PORT" "$tmp/mnt" 2>&1); then
    fail "mount --data-path iser was accepted"
else
    grep -q "moves data over TCP only" <<<"$out" && pass "mount refuses --data-path iser: $out" || fail "mount: $out"
fi

echo "data paths: failed=$failed"
[ "$failed" = 0 ]
