#!/bin/bash
# bench/striped.sh — several streams filling one request (GMBlock paper experiment 2b on real I/O).
#
# One blockwire-target run, four LUNs of SIZE_MIB each, read sequentially by `blockwire bench`
# (BS per command, QD in flight, SECS per LUN) over TCP loopback:
#   0  striped, MEMBERS x STRIPE, O_DIRECT, sync_send on (chunks of CHUNK): the engine submits every
#      chunk's per-member extents together (one stream per member) and sends each Data-In PDU as
#      soon as its chunks are read
#   1  the same layout, sync_send off: the engine's serial baseline (read everything, then send)
#   2  one O_DIRECT file, sync_send on: one stream (reference)
#   3  the same striped layout, cached, no sync_send: the SCSI core path (page-cache copies; the
#      backstore runs one thread per member only for large O_DIRECT or durable requests)
# and prints MB/s and the ratios 0/1 (synchronized over serial on the striped LUN) and 0/2
# (several streams over one) from this one run.
#
# Members live in DIR (default /dev/shm: tmpfs, O_DIRECT works on kernels >= 6.6; DIR=/var/tmp
# puts them on a real disk). Caveat: here every member sits on the same device (tmpfs or the one
# virtio disk), and the engine already keeps all chunks of a request in flight even for one file,
# so the members are not independent disks and 0/2 stays near 1; independent member disks are
# what `cargo bench -p blockwire-target --features bench --bench synchro` emulates (experiment 2b, also with real I/O:
# O_DIRECT reads of striped members, a token bucket per member, TCP loopback sends). Members are filled with random data first (reads of holes cost
# nothing). Not run by CI. Release builds of blockwire-target and the blockwire CLI (built if
# missing). Other compiles beside it distort the numbers: it waits (bounded) for rustc to finish.
# Env: DIR, SIZE_MIB (128), MEMBERS (4), STRIPE (64K), CHUNK (64K), BS (1M), QD (1), SECS (3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

DIR=${DIR:-/dev/shm}
SIZE_MIB=${SIZE_MIB:-128}
MEMBERS=${MEMBERS:-4}
STRIPE=${STRIPE:-64K}
CHUNK=${CHUNK:-64K}
BS=${BS:-1M}
QD=${QD:-1}
SECS=${SECS:-3}
IQN=iqn.2026-11.io.blockwire:striped-bench
. "$here/lib.sh"

if [ ! -x "$build/blockwire-target" ] || [ ! -x "$build/blockwire" ]; then
    echo "building blockwire-target and the blockwire CLI (release)" >&2
    (cd "$repo" && cargo build --release -p blockwire-mgmt -p blockwire-initiator >&2)
fi
wait_for_rustc

tmp=$(mktemp -d "$DIR/bw-striped.XXXXXX")
pid=""
cleanup() { stop_daemon; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM

per_member=$((SIZE_MIB / MEMBERS))
[ $((per_member * MEMBERS)) -eq "$SIZE_MIB" ] || { echo "SIZE_MIB must be a multiple of MEMBERS" >&2; exit 1; }
members() { # LUN -> TOML list of its member paths
    local l=$1 i out=""
    for ((i = 0; i < MEMBERS; i++)); do out+="${out:+, }\"$tmp/l$l-m$i.img\""; done
    echo "[$out]"
}
echo "filling $((3 * SIZE_MIB + SIZE_MIB)) MiB of backstore files in $tmp" >&2
for l in 0 1 3; do
    for ((i = 0; i < MEMBERS; i++)); do
        head -c "${per_member}M" /dev/urandom >"$tmp/l$l-m$i.img"
    done
done
head -c "${SIZE_MIB}M" /dev/urandom >"$tmp/l2.img"

port=$(free_port)
cat >"$tmp/target.toml" <<EOF
[[portal_group]]
tag = 1
listen = ["127.0.0.1:$port"]

[[target]]
name = "$IQN"

[[target.lun]]
id = 0
backstore = "striped"
paths = $(members 0)
stripe_chunk = "$STRIPE"
mode = "direct"
sync_send = true
sync_chunk = "$CHUNK"

[[target.lun]]
id = 1
backstore = "striped"
paths = $(members 1)
stripe_chunk = "$STRIPE"
mode = "direct"
sync_send = false

[[target.lun]]
id = 2
backstore = "file"
path = "$tmp/l2.img"
mode = "direct"
sync_send = true
sync_chunk = "$CHUNK"

[[target.lun]]
id = 3
backstore = "striped"
paths = $(members 3)
stripe_chunk = "$STRIPE"
mode = "cached"
EOF
start_daemon "$tmp/target.log"
grep -E "READ engine" "$tmp/target.log" | plain | sed 's/^.*READ engine: /READ engine: /' >&2

declare -A rates
for lun in 0 1 2 3; do
    bench_cli "$lun" --pattern seq --op read --bs "$BS" --qd "$QD"
    rates[$lun]=$mbps
done

echo "# striped backstore, $MEMBERS members x $STRIPE in $DIR, $SIZE_MIB MiB LUNs, seq READ bs=$BS qd=$QD, ${SECS}s each"
printf "%-58s %10s\n" "LUN" "MB/s"
printf "%-58s %10s\n" "0 striped O_DIRECT, sync_send (c = $CHUNK, $MEMBERS streams)" "${rates[0]}"
printf "%-58s %10s\n" "1 striped O_DIRECT, serial (engine: read all, then send)" "${rates[1]}"
printf "%-58s %10s\n" "2 one O_DIRECT file, sync_send (c = $CHUNK, 1 stream)" "${rates[2]}"
printf "%-58s %10s\n" "3 striped cached, SCSI core path" "${rates[3]}"
python3 - "${rates[0]}" "${rates[1]}" "${rates[2]}" <<'EOF'
import sys
sync, serial, single = map(float, sys.argv[1:])
print(f"synchronized / serial on the striped LUN: {sync / serial:.2f}x ({(sync / serial - 1) * 100:+.0f}%)")
print(f"striped ({'several'} streams) / one file, both synchronized: {sync / single:.2f}x")
EOF
kill "$pid"
wait "$pid" 2>/dev/null || true
pid=""
grep -E "READ state timers" "$tmp/target.log" | plain | sed 's/^.*READ state timers: /READ state timers: /' | head -8
