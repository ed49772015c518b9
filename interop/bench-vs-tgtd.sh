#!/bin/bash
# interop/bench-vs-tgtd.sh — the same libiscsi workloads against blockwire-target and tgtd in
# one run; prints both, their ratio, and each target's CPU time per I/O.
#
# Not run by CI (a benchmark: ~2.5 minutes with the default 10 s per workload). Uses the
# release build of blockwire-target (lib/blockwire.sh builds it if missing). Do not run it
# while cargo builds: it waits (bounded) for running rustc processes to finish first.
#
# Targets: both serve a 1 GiB LUN backed by a file in /dev/shm (tmpfs), so the storage under
# both is the same page cache: blockwire with `backstore = "file"` (BW_BACKSTORE=ram for its
# RAM store instead), tgtd with its default rdwr store (it has no RAM store). Before the
# workloads the whole LUN is written once on each target so that reads hit written data.
#
# Client: libiscsi (libiscsi.so.7) for everything.
#   - interop/libiscsi_rw.py --bench: libiscsi's async API driven from Python (ctypes),
#     --qd commands in flight, WRITE(16)/READ(16). It is used for reads AND writes so that
#     both directions go through the same client. iscsi-perf cannot write, and Debian's fio
#     has no libiscsi engine. At 4 KiB / qd 32 the Python client itself costs roughly a
#     core, so those numbers are bounded by the client on this 2-core machine; the target's
#     CPU time per I/O is still measured exactly.
#   - iscsi-perf (C, libiscsi's own READ benchmark): random/sequential reads, as a
#     cross-check with a cheaper client.
# Workloads (SECS each, default 10): 4 KiB random read and write at queue depth 1 and 32
# over the whole LUN, 1 MiB sequential read and write at queue depth 8.
# CPU: utime+stime of the target process (all its threads) from /proc/PID/stat before and
# after each workload, divided by the I/Os done: microseconds of target CPU per I/O.
#
# Output: a table on stdout, also written to interop/results/bench-vs-tgtd.md.
# Env: SECS (per workload), BW_BACKSTORE (file|ram), QD_SEQ (default 8).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"

SECS=${SECS:-10}
BW_BACKSTORE=${BW_BACKSTORE:-file}
QD_SEQ=${QD_SEQ:-8}
SIZE_MIB=1024
IQN_BW=iqn.2026-11.io.blockwire:bench
IQN_TGT=iqn.2026-11.io.tgtd:bench
HZ=$(getconf CLK_TCK)

tmp=$(mktemp -d /dev/shm/bw-bench.XXXXXX)
bw_pid="" tgt_pid="" tgt_port=""
cleanup() {
    if [ -n "$bw_pid" ]; then stop_blockwire "$bw_pid" 2>/dev/null || true; fi
    stop_tgtd "$tgt_port" "$tgt_pid"
    rm -rf "$tmp"
}
trap cleanup EXIT

bin=$(blockwire_bin)
# A compile running beside the benchmark would distort it: wait (<= 15 min) for it to end.
if pgrep -x rustc >/dev/null; then
    echo "waiting for a running cargo build (rustc) to finish..." >&2
    timeout 900 bash -c 'while pgrep -x rustc >/dev/null; do sleep 5; done' ||
        echo "WARNING: rustc still running; numbers will be noisy" >&2
fi

# --- targets
bw_port=$(free_port)
{
    echo '[[portal_group]]'
    echo 'tag = 1'
    echo 'listen = ["127.0.0.1:3260"]'
    echo '[[target]]'
    echo "name = \"$IQN_BW\""
    echo '[[target.lun]]'
    echo 'id = 0'
    if [ "$BW_BACKSTORE" = ram ]; then
        echo 'backstore = "ram"'
    else
        echo 'backstore = "file"'
        echo "path = \"$tmp/blockwire-lun.img\""
    fi
    echo "size = \"${SIZE_MIB}M\""
} >"$tmp/bench.toml"
bw_pid=$(start_blockwire "$bw_port" "$tmp" "$tmp/bench.toml")
tgt_port=$(free_port)
tgt_pid=$(start_tgtd "$tgt_port" "$tmp")
tgtd_new_target "$tgt_port" 1 "$IQN_TGT"
tgtd_add_lun "$tgt_port" 1 1 "$tmp/tgtd-lun.img" "$SIZE_MIB"

# name -> "portal iqn lun pid"
declare -A T=(
    [blockwire]="127.0.0.1:$bw_port $IQN_BW 0 $bw_pid"
    [tgtd]="127.0.0.1:$tgt_port $IQN_TGT 1 $tgt_pid"
)

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

echo "prefill: writing the whole ${SIZE_MIB} MiB LUN once on each target" >&2
head -c "${SIZE_MIB}M" /dev/zero | tr '\0' 'Z' >"$tmp/fill"
for t in blockwire tgtd; do
    read -r portal iqn lun _ <<<"${T[$t]}"
    timeout 300 python3 "$here/libiscsi_rw.py" "$portal" "$iqn" "$lun" --qd 8 \
        --write-from "$tmp/fill" >&2
done
rm -f "$tmp/fill"

# run TARGET TOOL WORKLOAD XFER QD — prints "iops MBps us_cpu_per_io"
run() {
    local t=$1 tool=$2 w=$3 xfer=$4 qd=$5 portal iqn lun pid c0 c1 out ios secs iops mbps
    read -r portal iqn lun pid <<<"${T[$t]}"
    c0=$(cpu_ticks "$pid")
    if [ "$tool" = py ]; then
        out=$(timeout $((SECS + 60)) python3 "$here/libiscsi_rw.py" "$portal" "$iqn" "$lun" \
            --bench "$w" --xfer "$xfer" --qd "$qd" --seconds "$SECS" --span $((SIZE_MIB << 20)))
        c1=$(cpu_ticks "$pid")
        ios=$(sed -n 's/.* ios=\([0-9]*\).*/\1/p' <<<"$out")
        secs=$(sed -n 's/.* secs=\([0-9.]*\).*/\1/p' <<<"$out")
    else
        # iscsi-perf: reads only; -r random, -m requests in flight, -b blocks per request,
        # -t seconds. Its last line: "iops average N (M MB/s)".
        local -a o=(-m "$qd" -b $((xfer / 512)) -t "$SECS")
        [ "$w" = randread ] && o+=(-r)
        out=$(timeout -s INT $((SECS + 30)) iscsi-perf "${o[@]}" "iscsi://$portal/$iqn/$lun" 2>&1 |
            tr '\r' '\n' | grep -o 'iops average [0-9]*' | tail -n 1 | grep -o '[0-9]*$' || true)
        c1=$(cpu_ticks "$pid")
        secs=$SECS
        ios=$(( ${out:-0} * SECS ))
    fi
    if [ -z "$ios" ] || [ "$ios" = 0 ]; then
        echo "0 0 0"
        return
    fi
    python3 -c 'import sys
ios, secs, xfer, dt, hz = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
print(f"{ios / secs:.0f} {ios * xfer / secs / 1e6:.1f} {dt / hz / ios * 1e6:.2f}")' \
        "$ios" "$secs" "$xfer" "$((c1 - c0))" "$HZ"
}

ratio() { python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f"{a / b:.2f}" if b else "-")' "$1" "$2"; }

results=$tmp/results.txt
printf '%-38s | %10s %9s %8s | %10s %9s %8s | %6s %6s\n' workload "bw IOPS" "bw MB/s" "bw us/io" \
    "tgtd IOPS" "tgtd MB/s" "tgt us/io" "ratio" "cpu" | tee "$results"
for spec in \
    "py randread 4096 1" "py randread 4096 32" \
    "py randwrite 4096 1" "py randwrite 4096 32" \
    "py seqread 1048576 $QD_SEQ" "py seqwrite 1048576 $QD_SEQ" \
    "perf randread 4096 1" "perf randread 4096 32" "perf seqread 1048576 $QD_SEQ"; do
    read -r tool w xfer qd <<<"$spec"
    read -r bi bm bc <<<"$(run blockwire "$tool" "$w" "$xfer" "$qd")"
    read -r ti tm tc <<<"$(run tgtd "$tool" "$w" "$xfer" "$qd")"
    label="$w $((xfer / 1024))KiB qd$qd ($([ "$tool" = py ] && echo libiscsi_rw.py || echo iscsi-perf))"
    printf '%-38s | %10s %9s %8s | %10s %9s %8s | %6s %6s\n' "$label" "$bi" "$bm" "$bc" \
        "$ti" "$tm" "$tc" "$(ratio "$bi" "$ti")" "$(ratio "$bc" "$tc")" | tee -a "$results"
done
echo "ratio = blockwire IOPS / tgtd IOPS (>1: blockwire faster); cpu = blockwire CPU per I/O / tgtd's (<1: blockwire cheaper)"

mkdir -p "$here/results"
{
    echo "# Benchmark: blockwire vs tgtd (libiscsi clients)"
    echo
    echo "Generated by \`interop/bench-vs-tgtd.sh\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $(uname -r)), ${SECS} s per workload, 1 GiB LUN backed by /dev/shm on both (blockwire backstore: $BW_BACKSTORE; tgtd: rdwr file), whole LUN written once before the runs. blockwire: release build of $(date -u -r "$bin" +%H:%M) UTC, repository HEAD $(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo "?") at run time. Client and targets share the machine's $(nproc) cores. us/io = target CPU (user+system, all threads) per I/O in microseconds."
    echo
    echo '```'
    cat "$results"
    echo '```'
    echo
    echo "ratio = blockwire IOPS / tgtd IOPS (>1: blockwire faster); cpu = blockwire us/io / tgtd us/io (<1: blockwire cheaper). libiscsi_rw.py = libiscsi's async API from Python (reads and writes); iscsi-perf = libiscsi's C read benchmark."
} >"$here/results/bench-vs-tgtd.md"
echo "written: $here/results/bench-vs-tgtd.md"
