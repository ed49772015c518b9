#!/bin/bash
# bench/send-paths.sh — the four READ send paths of one daemon run, side by side (zero-copy
# sendfile and synchronized sends against the copy path), plus the disk rate and the network rate of the synchronized LUN apart.
#
# One release blockwire-target serves four file LUNs of SIZE_MIB each:
#   0  cached, sendfile (the default `zero_copy = true`): page cache -> socket, no user buffer
#   1  cached, copy path (`zero_copy = false`): pread into a buffer, then send (the baseline)
#   2  direct, engine serial (`mode = "direct"`): O_DIRECT READ_FIXED into a registered buffer,
#      read everything, then send
#   3  direct, engine synchronized (`mode = "direct"`, `sync_send = true`, `sync_chunk = CHUNK`)
# Each LUN is read sequentially by `blockwire bench` (BS per command) at every queue depth in QDS
# for SECS seconds. Per point: MB/s, the target's CPU time per byte (utime+stime of the daemon from
# /proc/<pid>/stat before and after), and, from the daemon's shutdown log (SIGTERM,
# BLOCKWIRE_LOG=info), the copy counter's per-path copies per payload byte: user space (our
# memcpys) and kernel (page cache -> user buffer, user buffer -> socket, MSG_ZEROCOPY sends the
# kernel copied anyway, which it does on loopback). The counter is per path, not per LUN: LUNs 2
# and 3 share the "engine" path's totals. Ratios are against the copy path at the same QD.
#
# Then two more daemon runs on the same files, reading only LUN 3 (direct, synchronized) at each QD:
# `--no-net` (read through the engine, nothing sent: the disk rate) and `--no-disk` (pattern data,
# no backstore I/O: the network rate), next to the normal rate of the first run.
#
# Files live in DIR (default /var/tmp: the VM's ext4 virtio disk, so the direct LUNs really read
# a disk while the cached ones are served from the page cache, as deployed, and --no-net measures
# a real disk rate; /dev/shm would make O_DIRECT a kernel memcpy from tmpfs pages and pin
# 4 x SIZE_MIB of RAM). They are filled with random data (holes read for free), synced, the
# direct ones dropped from the page cache, the cached ones read once so they are resident.
# The daemon's zero-copy sends stay at their default (on), and `local_copy_sends = false` makes
# it treat its client on 127.0.0.1 as a remote initiator: each LUN takes the path it names
# (sendfile, MSG_ZEROCOPY) rather than the copying sends an initiator on this host gets by
# default (a send from the file's mapping, no MSG_ZEROCOPY). Not run by CI. Compiles beside it
# distort the numbers: it waits (bounded) for rustc to finish.
# Env: DIR, SIZE_MIB (1024), BS (1M), QDS ("1 8"), SECS (3), CHUNK (64K).
# Run time: about 2 + 14 x SECS seconds plus the fill (~4 x SIZE_MIB of writes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)

DIR=${DIR:-/var/tmp}
SIZE_MIB=${SIZE_MIB:-1024}
BS=${BS:-1M}
QDS=${QDS:-"1 8"}
SECS=${SECS:-3}
CHUNK=${CHUNK:-64K}
IQN=iqn.2026-11.io.blockwire:send-paths-bench

. "$here/lib.sh"

build_release
wait_for_rustc

tmp=$(mktemp -d "$DIR/bw-send-paths.XXXXXX")
pid=""
cleanup() { stop_daemon; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM

echo "filling 4 x $SIZE_MIB MiB of backstore files in $tmp" >&2
fill_random 0 1 2 3
python3 - "$tmp" <<'EOF'
import os, sys
d = sys.argv[1]
for l in (2, 3):  # direct LUNs: nothing of them in the page cache
    fd = os.open(f"{d}/l{l}.img", os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
for l in (0, 1):  # cached LUNs: resident
    with open(f"{d}/l{l}.img", "rb") as f:
        while f.read(1 << 24): pass
EOF

port=$(free_port)
cat >"$tmp/target.toml" <<EOF
[fabric]
nop_interval_secs = 0
local_copy_sends = false

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

[[target.lun]]
id = 1
backstore = "file"
path = "$tmp/l1.img"
size = "${SIZE_MIB}M"
zero_copy = false

[[target.lun]]
id = 2
backstore = "file"
path = "$tmp/l2.img"
size = "${SIZE_MIB}M"
mode = "direct"

[[target.lun]]
id = 3
backstore = "file"
path = "$tmp/l3.img"
size = "${SIZE_MIB}M"
mode = "direct"
sync_send = true
sync_chunk = "$CHUNK"
EOF

start_run() { # flags... -> $pid, log in $tmp/target$run.log
    start_daemon "$tmp/target$run.log" "$@"
    plain <"$tmp/target$run.log" | grep -E "READ engine|zero-copy|BENCHMARK" | sed 's/^.*\(READ engine\)/\1/' >&2
}
points="$tmp/points"
: >"$points"
bench_point() { # run lun qd
    local run=$1 lun=$2 qd=$3 c0 c1 ios mbps
    c0=$(cpu_ticks)
    bench_cli "$lun" --pattern seq --op read --bs "$BS" --qd "$qd"
    c1=$(cpu_ticks)
    echo "$run $lun $qd $ios $mbps $((c1 - c0))" >>"$points"
}

run=normal
start_run
for lun in 0 1 2 3; do for qd in $QDS; do bench_point normal $lun "$qd"; done; done
stop_daemon
summary="$tmp/summary"
plain <"$tmp/targetnormal.log" | grep "copy counter summary" >"$summary" || true
plain <"$tmp/targetnormal.log" | grep "READ state timers" | sed 's/^.*READ state timers: //' >"$tmp/timers" || true

run=nonet
start_run --no-net
for qd in $QDS; do bench_point nonet 3 "$qd"; done
stop_daemon
plain <"$tmp/targetnonet.log" | grep "copy counter summary" | sed 's/^/nonet /' >>"$summary" || true

run=nodisk
start_run --no-disk
for qd in $QDS; do bench_point nodisk 3 "$qd"; done
stop_daemon

python3 - "$points" "$summary" "$(getconf CLK_TCK)" "$BS" "$SIZE_MIB" "$DIR" "$SECS" "$CHUNK" <<'EOF'
import re, sys
points_f, summary_f, tck, bs, size_mib, d, secs, chunk = sys.argv[1:]
tck = int(tck)
units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
m = re.fullmatch(r"(\d+)([KMG]?)", bs.upper())
bsb = int(m.group(1)) * units[m.group(2)]
pts = {}
for line in open(points_f):
    run, lun, qd, ios, mbps, ticks = line.split()
    b = int(ios) * bsb
    pts[(run, int(lun), int(qd))] = (float(mbps), int(ticks) * 1e9 / tck / b if b else float("nan"), b)
copies = {}
for line in open(summary_f):
    f = dict(re.findall(r'(\w+)="?([\w.-]+)"?', line))
    if "path" not in f:
        continue
    key = ("nonet:" if line.startswith("nonet ") else "") + f["path"]
    pay = int(f["payload"])
    user = int(f["user_copied"])
    kern = int(f["read_to_user"]) + int(f["sent_from_user"]) + int(f["zc_copied"])
    copies[key] = (user / pay, kern / pay, pay) if pay else (float("nan"),) * 2 + (0,)
names = {0: ("sendfile (cached)", "sendfile"), 1: ("copy (cached, zero_copy=false)", "copy"),
         2: ("engine serial (direct)", "engine"), 3: (f"engine synchronized (direct, c={chunk})", "engine")}
qds = sorted({k[2] for k in pts if k[0] == "normal"})
print(f"# READ send paths, one daemon run: {size_mib} MiB file LUNs in {d}, sequential READ bs={bs}, {secs}s per point")
print("# CPU = the target daemon's utime+stime per payload byte; copies per payload byte from its copy counter")
print("# (per path: both engine LUNs share the 'engine' totals); ratios vs the copy path at the same QD")
hdr = f"{'path':<38} {'QD':>3} {'MB/s':>8} {'CPU ns/B':>9} {'user cp/B':>10} {'kern cp/B':>10} {'MB/s x':>7} {'CPU/B x':>8} {'copies x':>9}"
print(hdr)
for qd in qds:
    base = pts.get(("normal", 1, qd))
    bc = copies.get("copy")
    for lun in (0, 1, 2, 3):
        p = pts.get(("normal", lun, qd))
        if not p:
            continue
        name, path = names[lun]
        u, k, _ = copies.get(path, (float("nan"),) * 3)
        r_mb = p[0] / base[0] if base and base[0] else float("nan")
        r_cpu = p[1] / base[1] if base and base[1] else float("nan")
        r_cp = (u + k) / (bc[0] + bc[1]) if bc and (bc[0] + bc[1]) else float("nan")
        print(f"{name:<38} {qd:>3} {p[0]:>8.1f} {p[1]:>9.3f} {u:>10.3f} {k:>10.3f} {r_mb:>7.2f} {r_cpu:>8.2f} {r_cp:>9.2f}")
print()
print(f"# disk rate and network rate apart, LUN 3 (direct, synchronized, c={chunk}): three daemon runs")
print(f"{'QD':>3} {'normal MB/s':>12} {'--no-net (disk)':>16} {'--no-disk (net)':>16} {'normal/min':>11} {'serial model':>13}")
for qd in qds:
    n, dk, nt = (pts.get((r, 3, qd), (float("nan"),) * 3)[0] for r in ("normal", "nonet", "nodisk"))
    lo = min(dk, nt)
    serial = 1 / (1 / dk + 1 / nt) if dk and nt else float("nan")
    print(f"{qd:>3} {n:>12.1f} {dk:>16.1f} {nt:>16.1f} {n / lo:>11.2f} {serial:>13.1f}")
print("# normal/min: the normal rate over the slower side (1.00 = full overlap of disk and network);")
print("# serial model: 1/(1/disk + 1/net), what reading all then sending would give")
cpu = {r: pts.get((r, 3, qds[0])) for r in ("normal", "nonet", "nodisk")}
print("# CPU ns/B at QD %d: normal %.3f, --no-net %.3f, --no-disk %.3f" % (
    qds[0], *(cpu[r][1] if cpu[r] else float("nan") for r in ("normal", "nonet", "nodisk"))))
nn = copies.get("nonet:no-net")
if nn:
    print(f"# --no-net copy counter (no-net path): user {nn[0]:.3f}, kernel {nn[1]:.3f} copies/B over {nn[2] >> 20} MiB read")
EOF
echo
echo "# per-LUN READ state timers (engine path, normal run; mean/p99):"
cat "$tmp/timers"
