#!/bin/bash
# bench/sync-write.sh — double-buffered WRITEs (`sync_write`) on vs off, one daemon
# run.
#
# One release blockwire-target serves two O_DIRECT file LUNs (`mode = "direct"`) of SIZE_MIB each:
#   0  sync_write = true (chunks of CHUNK): each chunk of a WRITE goes to disk (I/O engine,
#      registered buffer) as soon as its Data-Out arrived, while the next one arrives
#   1  sync_write off: the whole WRITE is gathered, then written (the baseline)
# Each LUN gets sequential WRITEs of every size in BSS at QD1 by `blockwire bench` for SECS
# seconds; printed: MB/s, the target's CPU time per byte (utime+stime of the daemon from
# /proc/<pid>/stat) and the ratio on/off per size, all from this one run.
#
# Files live in DIR (default /var/tmp: the VM's ext4 virtio disk, so O_DIRECT writes reach a
# real disk; on /dev/shm they would be memcpys into tmpfs). They are filled with random data first
# so both LUNs overwrite allocated blocks (no extent allocation in the measurement). The CLI
# negotiates its usual login keys (ImmediateData, FirstBurstLength, MaxBurstLength): large WRITEs
# take R2Ts either way. Not run by CI. Compiles beside it distort the numbers: it waits (bounded)
# for rustc to finish.
# Env: DIR, SIZE_MIB (1024), BSS ("1M 4M"), SECS (3), CHUNK (64K).
# Run time: about 2 x (number of sizes) x SECS seconds plus the fill (2 x SIZE_MIB of writes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

DIR=${DIR:-/var/tmp}
SIZE_MIB=${SIZE_MIB:-1024}
BSS=${BSS:-"1M 4M"}
SECS=${SECS:-3}
CHUNK=${CHUNK:-64K}
IQN=iqn.2026-11.io.blockwire:sync-write-bench

. "$here/lib.sh"

build_release
wait_for_rustc

tmp=$(mktemp -d "$DIR/bw-sync-write.XXXXXX")
pid=""
cleanup() { stop_daemon; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM

echo "filling 2 x $SIZE_MIB MiB of backstore files in $tmp" >&2
fill_random 0 1

port=$(free_port)
cat >"$tmp/target.toml" <<EOF
[fabric]
nop_interval_secs = 0

[[portal_group]]
tag = 1
listen = ["127.0.0.1:$port"]

[[target]]
name = "$IQN"

[[target.lun]]
id = 0
backstore = "file"
path = "$tmp/l0.img"
size = "${SIZE_MIB}M"
mode = "direct"
sync_write = true
sync_chunk = "$CHUNK"

[[target.lun]]
id = 1
backstore = "file"
path = "$tmp/l1.img"
size = "${SIZE_MIB}M"
mode = "direct"
EOF

log="$tmp/target.log"
start_daemon "$log"
plain <"$log" | grep -iE "sync_write|double-buffered|WRITE engine" | sed 's/^.*INFO [^ ]* //' >&2 || true

points="$tmp/points"
: >"$points"
for bs in $BSS; do
    for lun in 0 1; do
        c0=$(cpu_ticks)
        bench_cli "$lun" --pattern seq --op write --bs "$bs" --qd 1
        c1=$(cpu_ticks)
        echo "$bs $lun $ios $mbps $((c1 - c0))" >>"$points"
    done
done
stop_daemon

python3 - "$points" "$(getconf CLK_TCK)" "$SIZE_MIB" "$DIR" "$SECS" "$CHUNK" <<'EOF'
import re, sys
points_f, tck, size_mib, d, secs, chunk = sys.argv[1:]
tck = int(tck)
units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
def size(s):
    m = re.fullmatch(r"(\d+)([KMG]?)", s.upper())
    return int(m.group(1)) * units[m.group(2)]
pts, order = {}, []
for line in open(points_f):
    bs, lun, ios, mbps, ticks = line.split()
    b = int(ios) * size(bs)
    pts[(bs, int(lun))] = (float(mbps), int(ticks) * 1e9 / tck / b if b else float("nan"))
    if bs not in order:
        order.append(bs)
print(f"# double-buffered WRITEs, one daemon run: {size_mib} MiB O_DIRECT file LUNs in {d}, sequential WRITE, QD1, {secs}s per point")
print(f"{'bs':>4} {'sync_write MB/s':>16} {'off MB/s':>9} {'on/off':>7} {'CPU ns/B on':>12} {'CPU ns/B off':>13}")
for bs in order:
    on, off = pts[(bs, 0)], pts[(bs, 1)]
    print(f"{bs:>4} {on[0]:>16.1f} {off[0]:>9.1f} {on[0] / off[0]:>7.2f} {on[1]:>12.3f} {off[1]:>13.3f}")
print(f"# sync_write chunk c = {chunk}")
EOF
