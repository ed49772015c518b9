#!/bin/bash
# interop/bench-vs-tgtd.sh — the same workloads against blockwire-target and tgtd in one run,
# alternating target by target for each workload; prints both, their ratio, and each target's
# CPU time per I/O; then the 1 MiB rows against the machine's TCP loopback rate (iperf3) and a
# QEMU write-then-read-back measurement.
#
# Not run by CI (a benchmark: about 12 minutes with the defaults, 2 rounds of 5 s, the pinned
# QD1 rows included). Uses the release build of blockwire-target (lib/blockwire.sh builds it if
# missing). Do not run it while cargo builds: it waits (bounded) for running rustc processes to
# finish first.
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
#     core, so those numbers are bounded by the client on this 2-core machine (its loop does
#     the least Python it can per command, and most of what it costs is then the kernel's:
#     libiscsi's two sends per WRITE: section "A leaner Python client" of
#     interop/results/bench-vs-tgtd.md); the target's CPU time per I/O is still measured
#     exactly.
#   - iscsi-perf (C, libiscsi's own READ benchmark): random/sequential reads, as a
#     cross-check with a cheaper client.
# and blockwire's own initiator, `blockwire bench` (release build of the CLI, built if
# missing; BLOCKWIRE_CLI for another): READs and WRITEs, --qd commands in flight on one
# session on one thread (its default for bench), Data-In read from the socket straight into
# the command's buffer. It is the cheapest client here per 1 MiB, so its 1 MiB rows show best
# how close a target comes to the loopback rate when the client is not what limits it.
# and QEMU (Debian's qemu-utils + qemu-block-extra: QEMU's own iscsi block driver):
#   - fio through qemu-nbd: `qemu-nbd iscsi://127.0.0.1:PORT/IQN/LUN` exports each target's
#     LUN on a Unix socket and fio's `nbd` ioengine (libnbd) drives it (this host's kernel
#     has no nbd module, so no /dev/nbdX). So fio's I/O goes fio -> NBD -> qemu-nbd ->
#     QEMU's iscsi driver (libiscsi) -> target, the path of a QEMU guest disk.
#   - qemu-io with the iscsi:// URL for the read-back measurement below.
# Loopback, in the same run, three ways:
#   - iperf3, one TCP stream over 127.0.0.1 with 1 MiB writes of one buffer for SECS: the rate
#     one connection can reach on this machine with data that stays in the CPU caches. It runs
#     once after the workloads and, for each 1 MiB row, in each of the row's rounds beside the
#     two targets ("rounds lo"; see `measure`);
#   - iperf3 -Z -F of a 1 GiB LUN file in /dev/shm (passes repeated for SECS): the rate one
#     connection moves the bytes a 1 GiB LUN holds, which are not in the CPU caches (see
#     loopback_file).
#   - target/examples/loopback_pair: a bare sender and receiver, no iSCSI, one connection, SECS
#     each way: the sender sendfile(2)s the 1 GiB LUN file (as a sendfile target does), sends
#     it by copying sends from its mapping (as blockwire does to an initiator on this host,
#     `--mapped`) or writes one hot 1 MiB buffer (as iperf3 does); the receiver reads into QD_SEQ buffers of
#     1 MiB in turn, as a client with QD_SEQ 1 MiB READs in flight places their data, where
#     iperf3's receiver reads into one buffer again and again. It measures what the 1 MiB READ
#     rows can reach on this machine when the client keeps what it reads.
# The 1 MiB sequential rows are printed as a fraction of each (iperf3: of its rounds and of its
# one run).
# QEMU read-back: a list of random, non-overlapping blocks of 4-64 KiB (4 KiB multiples,
# 4 KiB aligned) totalling RB_MIB (32) MiB over a 256 MiB LUN (blockwire: a RAM LUN, where
# the allocation map answers GET LBA STATUS; tgtd: an rdwr file in /dev/shm, it has no RAM
# store) is written by one qemu-io process (`write -P`, one command at a time), then read
# back and checked (`read -P`) by a second one: a fresh QEMU process knows nothing of what
# is allocated, so, as a guest reading its disk later, its iscsi driver asks GET LBA STATUS
# before reads of 32 KiB and more. Each phase's time is wall time of its qemu-io minus that
# of a qemu-io that only logs in and out (measured just before). Printed: write and read
# rate, read/write, and per phase
#   cp/B = copies per payload byte, counted two ways since the targets differ:
#     tgtd: (delta rchar + delta wchar of the process, /proc/PID/io) / payload bytes, the
#       bytes it moved through read/write-family system calls: it reads sockets and files
#       with read/pread and writes them with write/pwrite, each a kernel copy, and has no
#       user-space copy of payloads in its rdwr path, so this is its copy count.
#     blockwire: its sockets use recv/sendmsg, which /proc/PID/io does not count, so for
#       reads its own copy counter (the daemon's metrics, blockwire_read_path_copy_bytes_total:
#       user-space memcpy + page cache to user + user to socket + MSG_ZEROCOPY sends the
#       kernel copied, target/src/copies.rs) / payload bytes; writes have no such counter
#       (n/a).
#   Work that is not a payload copy (GET LBA STATUS walking an allocation map, or reading
#   blocks to derive one) shows in the target CPU per MiB printed beside it.
# Workloads: 4 KiB random read and write at queue depth 1 and 32
# over the whole LUN, 1 MiB sequential read and write at queue depth 8.
# CPU: utime+stime of the target process (all its threads) from /proc/PID/stat before and
# after each workload, divided by the I/Os done: microseconds of target CPU per I/O.
# The machine's busy time (/proc/stat: all CPUs, everything but idle and iowait) is read
# around the same client run (its start-up and exit included). What is not the target's is
# the client's (and the kernel work it causes): a second table prints that "rest" per I/O,
# the machine's idle share, and the IOPS the machine could reach if the target's CPU were
# zero and the rest per I/O stayed as it is (CPUs x 1e6 / rest us/io): what a cheaper target
# could gain with that client on this machine, as far as the client's cost per I/O holds.
# The client's own CPU time is read too (the shell's reaped children, /proc/PID/stat cutime +
# cstime, around the client's run, its start-up and login included; for fio, the qemu-nbd it
# drives, /proc/PID/stat of that process): "client%", a share of one CPU. The libiscsi clients
# and QEMU's iscsi driver run on one thread, so a client near 100 % sets the pace itself, and
# "client ceil" (IOPS / client share) is the rate at which it would be busy all the time at its
# CPU per I/O of this run: no target takes that client further unless it makes the client's
# own work per I/O cheaper (fewer segments and wake-ups to handle).
#
# QD1 rows: at one command in flight latency is 1/IOPS, so ratio >= 1 means blockwire's
# mean latency is at or below tgtd's. On a virtual machine most of a QD1 round trip can be the
# hypervisor waking an idle virtual CPU: where the scheduler happens to place the client and
# the target decides the result more than either program does (on the 2-vCPU VM of
# 2026-11-27, libiscsi_rw.py READ at QD1 ran at about 10 000 IOPS against either target with
# the two on different CPUs and at 41 000-51 000 on one). So each QD1 row also runs twice with
# the placement fixed by taskset(1): "[one CPU]" pins the client (fio and qemu-nbd for fio)
# and every thread of the target to CPU 0; "[two CPUs]" pins the target to CPU 0 and the
# client to CPU 1. The pins are lifted after each run.
#
# Output: a table on stdout, also written to interop/results/bench-vs-tgtd.md, with the load
# average and the busiest other processes at the start (the machine may be shared).
# Last, the rows this run measured against the goals they were written for, one line each
# with "met" or "NOT met": 4 KiB QD32 at >= 2x tgtd's IOPS and <= 0.5x its CPU per I/O (with
# the bound above beside a miss on IOPS), QD1 at >= 1x its IOPS, 1 MiB READ at >= 0.95x
# iperf3's loopback rate in the row's own rounds (the other loopback rates beside it), QEMU's
# read-back at >= 0.8x its write rate and <= 2 copies per payload byte.
# Each workload runs ROUNDS (default 2) times SECS (default 5) seconds per target, the
# targets' order swapped every round (A B B A ...) so that other load on the machine that
# comes or goes during a workload weighs on both; the rows are sums over the rounds. The
# QEMU read-back does the same (ROUNDS write and read-back passes per target).
# Env: SECS (per run), ROUNDS, BW_BACKSTORE (file|ram), QD_SEQ (default 8), RB_MIB (default 32),
# BLOCKWIRE_BIN (another blockwire-target binary, e.g. a build from before a change),
# BENCH_NOTE (a paragraph for the results file: what the binary is, what else ran),
# BW_BUSY_POLL_US (blockwire's [fabric] busy_poll_us; unset: the daemon's default, 50; 0: off),
# BW_CONNECTION_THREADS (its [fabric] connection_threads; unset: one per CPU; 0: the runtime's
# shared workers),
# ONLY (a regular expression: run only the rows whose "tool workload xfer qd [one|two]" matches
# it; the pinned QD1 rows end in "one" or "two"),
# WAIT_RUSTC=0 (do not wait for running compiles: quick checks of the script itself).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"

SECS=${SECS:-5}
ROUNDS=${ROUNDS:-2}
BW_BACKSTORE=${BW_BACKSTORE:-file}
QD_SEQ=${QD_SEQ:-8}
SIZE_MIB=1024
RB_MIB=${RB_MIB:-32}
RB_LUN_MIB=256
IQN_BW=iqn.2026-11.io.blockwire:bench
IQN_TGT=iqn.2026-11.io.tgtd:bench
HZ=$(getconf CLK_TCK)

tmp=$(mktemp -d /dev/shm/bw-bench.XXXXXX)
bw_pid="" tgt_pid="" tgt_port=""
nbd_pids=()
cleanup() {
    stop_qemu_nbd "${nbd_pids[@]}"
    if [ -n "$bw_pid" ]; then stop_blockwire "$bw_pid" 2>/dev/null || true; fi
    stop_tgtd "$tgt_port" "$tgt_pid"
    rm -rf "$tmp"
}
trap cleanup EXIT

bin=$(blockwire_bin)
bw_cli=$(blockwire_cli)
# The bare loopback pair (target/examples/loopback_pair.rs; see the header).
pair=$(loopback_pair_bin)
# A compile running beside the benchmark would distort it: wait (<= 15 min) for it to end.
compiling() { pgrep -x rustc >/dev/null || pgrep -x clippy-driver >/dev/null; }
if [ "${WAIT_RUSTC:-1}" = 1 ] && compiling; then
    echo "waiting for a running cargo build (rustc, clippy-driver) to finish..." >&2
    timeout 900 bash -c 'while pgrep -x rustc >/dev/null || pgrep -x clippy-driver >/dev/null; do sleep 5; done' ||
        echo "WARNING: rustc still running; numbers will be noisy" >&2
fi

# --- targets
bw_port=$(free_port)
metrics_port=$(free_port)
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
    # The QEMU read-back LUN.
    echo '[[target.lun]]'
    echo 'id = 1'
    echo 'backstore = "ram"'
    echo "size = \"${RB_LUN_MIB}M\""
    echo '[metrics]'
    echo "listen = \"127.0.0.1:$metrics_port\""
    if [ -n "${BW_BUSY_POLL_US:-}${BW_CONNECTION_THREADS:-}" ]; then
        echo '[fabric]'
        [ -z "${BW_BUSY_POLL_US:-}" ] || echo "busy_poll_us = $BW_BUSY_POLL_US"
        [ -z "${BW_CONNECTION_THREADS:-}" ] || echo "connection_threads = $BW_CONNECTION_THREADS"
    fi
} >"$tmp/bench.toml"
bw_pid=$(start_blockwire "$bw_port" "$tmp" "$tmp/bench.toml")
tgt_port=$(free_port)
tgt_pid=$(start_tgtd "$tgt_port" "$tmp")
tgtd_new_target "$tgt_port" 1 "$IQN_TGT"
tgtd_add_lun "$tgt_port" 1 1 "$tmp/tgtd-lun.img" "$SIZE_MIB"
tgtd_add_lun "$tgt_port" 1 2 "$tmp/tgtd-rb.img" "$RB_LUN_MIB"

# name -> "portal iqn lun pid"
declare -A T=(
    [blockwire]="127.0.0.1:$bw_port $IQN_BW 0 $bw_pid"
    [tgtd]="127.0.0.1:$tgt_port $IQN_TGT 1 $tgt_pid"
)
# name -> LUN of the QEMU read-back
declare -A RB_LUN=([blockwire]=1 [tgtd]=2)

# busy_ticks: the whole machine's non-idle CPU time so far (all CPUs), in ticks.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
NCPU=$(nproc)

echo "prefill: writing the whole ${SIZE_MIB} MiB LUN once on each target" >&2
head -c "${SIZE_MIB}M" /dev/zero | tr '\0' 'Z' >"$tmp/fill"
for t in blockwire tgtd; do
    read -r portal iqn lun _ <<<"${T[$t]}"
    timeout 300 python3 "$here/libiscsi_rw.py" "$portal" "$iqn" "$lun" --qd 8 \
        --write-from "$tmp/fill" >&2
done
rm -f "$tmp/fill"

# qemu-nbd per target: the LUN on a Unix socket for fio's nbd engine.
declare -A NBD NBD_PID
for t in blockwire tgtd; do
    read -r portal iqn lun _ <<<"${T[$t]}"
    NBD[$t]=$tmp/nbd-$t.sock
    NBD_PID[$t]=$(start_qemu_nbd "${NBD[$t]}" "iscsi://$portal/$iqn/$lun" "$tmp/qemu-nbd-$t.log")
    nbd_pids+=("${NBD_PID[$t]}")
done

# reaped_ticks — CPU time (user + system, ticks) of this shell's children that it has waited for,
# theirs and their own waited-for children's (/proc/PID/stat cutime + cstime), read without a
# subshell of its own; into the variable `reaped`.
reaped_ticks() {
    local -a st
    read -r -a st <"/proc/$BASHPID/stat"
    reaped=$((st[15] + st[16]))
}

# client_ticks TOOL TARGET — the client's CPU time so far (ticks), into the variable `reaped`:
# for fio, that of the qemu-nbd it drives; else of this shell's reaped children (reaped_ticks).
client_ticks() {
    if [ "$1" = fio ]; then reaped=$(cpu_ticks "${NBD_PID[$2]}"); else reaped_ticks; fi
}

# run TARGET TOOL WORKLOAD XFER QD — one SECS-long run; prints
# "ios secs target_ticks machine_busy_ticks client_ticks": client_ticks is the CPU time of the
# client process (for fio, of the qemu-nbd it drives: the busiest link of that chain), from
# just before it starts to just after it ends.
run() {
    local t=$1 tool=$2 w=$3 xfer=$4 qd=$5 place=${6:-free} portal iqn lun pid c0 c1 b0 b1 out ios secs iops mbps
    local reaped k0 k1
    read -r portal iqn lun pid <<<"${T[$t]}"
    local -a pin=()
    if [ "$place" != free ]; then
        local client_cpu=0
        [ "$place" = two ] && client_cpu=$((NCPU - 1))
        pin=(taskset -c "$client_cpu")
        taskset -a -p -c 0 "$pid" >/dev/null
        [ "$tool" = fio ] && taskset -a -p -c "$client_cpu" "${NBD_PID[$t]}" >/dev/null
    fi
    b0=$(busy_ticks)
    c0=$(cpu_ticks "$pid")
    client_ticks "$tool" "$t"
    k0=$reaped
    if [ "$tool" = fio ]; then
        local dir=read
        [[ $w == *write ]] && dir=write
        out=$(timeout $((SECS + 60)) "${pin[@]}" fio --name=bench --ioengine=nbd \
            --uri="nbd+unix:///?socket=${NBD[$t]}" --rw="$w" --bs="$xfer" --iodepth="$qd" \
            --size="${SIZE_MIB}M" --time_based --runtime="$SECS" --norandommap --randrepeat=0 \
            --output-format=json 2>/dev/null || true)
        client_ticks "$tool" "$t"
        k1=$reaped c1=$(cpu_ticks "$pid") b1=$(busy_ticks)
        read -r ios secs < <(python3 -c 'import json, sys
s = sys.stdin.read()
try:
    d = json.loads(s[s.index("{"):])["jobs"][0][sys.argv[1]]
    print(d["total_ios"], d["runtime"] / 1000)
except Exception:
    print(0, 0)' "$dir" <<<"$out")
    elif [ "$tool" = py ]; then
        out=$(timeout $((SECS + 60)) "${pin[@]}" python3 "$here/libiscsi_rw.py" "$portal" "$iqn" "$lun" \
            --bench "$w" --xfer "$xfer" --qd "$qd" --seconds "$SECS" --span $((SIZE_MIB << 20)))
        client_ticks "$tool" "$t"
        k1=$reaped c1=$(cpu_ticks "$pid") b1=$(busy_ticks)
        ios=$(sed -n 's/.* ios=\([0-9]*\).*/\1/p' <<<"$out")
        secs=$(sed -n 's/.* secs=\([0-9.]*\).*/\1/p' <<<"$out")
    elif [ "$tool" = bw ]; then
        local op=read pattern=rand
        [[ $w == *write ]] && op=write
        [[ $w == seq* ]] && pattern=seq
        out=$(timeout $((SECS + 60)) "${pin[@]}" "$bw_cli" bench -p "$portal" -T "$iqn" -l "$lun" \
            --pattern "$pattern" --op "$op" --bs "$xfer" --qd "$qd" --time "${SECS}s" 2>&1 || true)
        client_ticks "$tool" "$t"
        k1=$reaped c1=$(cpu_ticks "$pid") b1=$(busy_ticks)
        ios=$(sed -n 's/^ios=\([0-9]*\) .*/\1/p' <<<"$out")
        secs=$(sed -n 's/.* elapsed=\([0-9.]*\)s.*/\1/p' <<<"$out")
    else
        # iscsi-perf: reads only; -r random, -m requests in flight, -b blocks per request,
        # -t seconds. Its last line: "iops average N (M MB/s)".
        local -a o=(-m "$qd" -b $((xfer / 512)) -t "$SECS")
        [ "$w" = randread ] && o+=(-r)
        out=$(timeout -s INT $((SECS + 30)) "${pin[@]}" iscsi-perf "${o[@]}" "iscsi://$portal/$iqn/$lun" 2>&1 |
            tr '\r' '\n' | grep -o 'iops average [0-9]*' | tail -n 1 | grep -o '[0-9]*$' || true)
        client_ticks "$tool" "$t"
        k1=$reaped c1=$(cpu_ticks "$pid") b1=$(busy_ticks)
        secs=$SECS
        ios=$(( ${out:-0} * SECS ))
    fi
    if [ "$place" != free ]; then
        taskset -a -p -c "0-$((NCPU - 1))" "$pid" >/dev/null
        [ "$tool" = fio ] && taskset -a -p -c "0-$((NCPU - 1))" "${NBD_PID[$t]}" >/dev/null
    fi
    if [ -z "$ios" ] || [ "$ios" = 0 ] || [ -z "$secs" ]; then
        echo "0 0 0 0 0"
        return
    fi
    echo "$ios $secs $((c1 - c0)) $((b1 - b0)) $((k1 - k0))"
}

# measure TOOL WORKLOAD XFER QD [PLACE] — ROUNDS rounds, the targets' order swapped every round
# (blockwire, tgtd, then tgtd, blockwire, ...) so that a change in the machine's other load
# during the workload weighs on both alike; prints for each target, from the sums over the
# rounds, "iops MBps us_cpu_per_io" (blockwire's fields, then tgtd's), then for each target
# "rest_us_per_io idle_percent", then blockwire's bound ("bound_iops bound_over_tgtd_iops"), then
# for each target the client's CPU time as a percentage of one CPU over the run, then the
# client ceiling ("ceiling_iops ceiling_over_tgtd_iops"), then the loopback rate of the row's own
# rounds (MB/s; 0 for rows other than 1 MiB): for 1 MiB rows each round also runs iperf3 for SECS
# (see `loopback`) in the same rotation (blockwire, tgtd, iperf3, then iperf3, tgtd, blockwire),
# because this machine's loopback rate moves by a fifth from one minute to the next (5 005 and
# 5 994 MB/s back to back on the VM of interop/results/bench-vs-tgtd.md), more than the 0.95x
# goal leaves: a yardstick measured beside the row's own runs says what the loopback could do then.
measure() {
    local r t order i sec k m c stats
    local lo_json=$tmp/iperf3-rounds.json
    : >"$lo_json"
    declare -A ios=() secs=() ticks=() busy=() client=()
    for r in $(seq "$ROUNDS"); do
        order="blockwire tgtd"
        [ "$3" = 1048576 ] && order+=" iperf3"
        [ $((r % 2)) = 0 ] && order=$(tr ' ' '\n' <<<"$order" | tac | paste -sd' ')
        for t in $order; do
            if [ "$t" = iperf3 ]; then
                iperf3_json -t "$SECS" -l 1M >>"$lo_json"
                continue
            fi
            read -r i sec k m c <<<"$(run "$t" "$@")"
            ios[$t]=$((${ios[$t]:-0} + i))
            client[$t]=$((${client[$t]:-0} + c))
            busy[$t]=$((${busy[$t]:-0} + m))
            secs[$t]=$(awk -v a="${secs[$t]:-0}" -v b="$sec" 'BEGIN { print a + b }')
            ticks[$t]=$((${ticks[$t]:-0} + k))
        done
    done
    stats=$(python3 -c 'import sys
xfer, hz, ncpu = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out, rest, client = [], [], []
for ios, secs, dt, busy, cl in zip(*[iter(sys.argv[4:])] * 5):
    ios, secs, dt, busy, cl = int(ios), float(secs), int(dt), int(busy), int(cl)
    if ios and secs:
        out += [f"{ios / secs:.0f}", f"{ios * xfer / secs / 1e6:.1f}", f"{dt / hz / ios * 1e6:.2f}"]
        idle = max(0.0, 1 - busy / hz / (secs * ncpu))
        rest += [f"{max(0, busy - dt) / hz / ios * 1e6:.2f}", f"{idle * 100:.0f}"]
        client += [f"{cl / hz / secs * 100:.0f}"]
    else:
        out += ["0", "0", "0"]
        rest += ["0", "0"]
        client += ["0"]
# The IOPS with blockwire at zero CPU and its rest per I/O unchanged, and that over the tgtd IOPS.
bw_rest, tgtd_iops = float(rest[0]), float(out[3])
bound = ncpu * 1e6 / bw_rest if bw_rest else 0
bound_fields = [f"{bound:.0f}", f"{bound / tgtd_iops:.2f}" if tgtd_iops else "-"] if bound else ["-", "-"]
# The IOPS at which the client of blockwire would be busy all the time at its CPU per I/O of this
# run (its IOPS over the share of a CPU it used), and that over the IOPS of tgtd: for a client
# that runs on one thread, as near as that client gets to the goal whatever the target does,
# unless the target makes the work of the client per I/O cheaper.
bw_iops, bw_client = float(out[0]), float(client[0])
ceiling = bw_iops / (bw_client / 100) if bw_client else 0
ceiling_fields = [f"{ceiling:.0f}", f"{ceiling / tgtd_iops:.2f}" if tgtd_iops else "-"] if ceiling else ["-", "-"]
print(" ".join(out + rest + bound_fields + client + ceiling_fields))' "$3" "$HZ" "$NCPU" "${ios[blockwire]}" "${secs[blockwire]}" \
        "${ticks[blockwire]}" "${busy[blockwire]}" "${client[blockwire]}" "${ios[tgtd]}" "${secs[tgtd]}" \
        "${ticks[tgtd]}" "${busy[tgtd]}" "${client[tgtd]}")
    echo "$stats $(iperf3_received "$lo_json" | cut -d' ' -f1)"
}

ratio() {
    python3 -c 'import sys
try:
    a, b = float(sys.argv[1]), float(sys.argv[2])
except ValueError:
    a, b = 0.0, 0.0
print(f"{a / b:.2f}" if b else "-")' "$1" "$2"
}

# What else runs on this machine now (the targets and the clients share its cores with it).
load_note() {
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); busiest processes over 2 s (top):"
    top -b -n 2 -d 2 -w 200 | awk '/^ *PID/ { n++; next } n == 2 && NF >= 12 && $9 > 0 { print "    " $9 "% " $12 }' | head -n 6
}
load_note | tee "$tmp/load.txt" >&2

# iperf3_json ARGS... — one iperf3 client run (ARGS added) over 127.0.0.1 against a one-off
# server on a free port; prints its JSON report, nothing if it did not run.
iperf3_json() {
    local port srv
    port=$(free_port)
    srv=$(start_iperf3_server "$port")
    timeout $((SECS + 30)) iperf3 -c 127.0.0.1 -p "$port" -J "$@" 2>/dev/null || true
    stop_iperf3_server "$srv"
}

# iperf3 loopback: one stream, 1 MiB writes of one buffer, SECS seconds; prints MB/s.
loopback() {
    iperf3_json -t "$SECS" -l 1M >"$tmp/iperf3-buffer.json"
    iperf3_received "$tmp/iperf3-buffer.json" | cut -d' ' -f1
}

# iperf3 loopback of a file's bytes: `-Z -F FILE`, one pass over FILE per iperf3 run (it stops at
# end of file), repeated until SECS seconds of transfer; prints MB/s. iperf3 read(2)s each 1 MiB
# of FILE into its buffer (a temporary file in memory) and sends that buffer with sendfile(2)
# (strace shows `read(FILE, 1048576)` then `sendfile(sock, tmp, [0], 1048576)`). FILE is a 1 GiB
# LUN file in /dev/shm, so this is the rate one connection moves the bytes a 1 GiB LUN holds:
# they are not in the CPU caches and must be read once, which plain iperf3, sending one 1 MiB
# buffer again and again from the caches, never does.
loopback_file() {
    local reports=$tmp/iperf3-file.json out
    : >"$reports"
    while awk -v s="$(iperf3_received "$reports" | cut -d' ' -f2)" -v limit="$SECS" 'BEGIN { exit !(s < limit) }'; do
        out=$(iperf3_json -l 1M -Z -F "$1")
        grep -q '"sum_received"' <<<"$out" || break # iperf3 failed: report what was measured
        echo "$out" >>"$reports"
    done
    iperf3_received "$reports" | cut -d' ' -f1
}

seq_rows=()
rest_rows=()
# Each row's figures for the closing comparison with the goals (see goals_summary).
goal_rows=()
# The width of the workload column (the longest label and its placement tag).
LW=50
results=$tmp/results.txt
printf '%-*s | %10s %9s %8s | %10s %9s %8s | %6s %6s\n' "$LW" workload "bw IOPS" "bw MB/s" "bw us/io" \
    "tgtd IOPS" "tgtd MB/s" "tgt us/io" "ratio" "cpu" | tee "$results"
for spec in \
    "py randread 4096 1" "py randread 4096 32" \
    "py randwrite 4096 1" "py randwrite 4096 32" \
    "py seqread 1048576 $QD_SEQ" "py seqwrite 1048576 $QD_SEQ" \
    "perf randread 4096 1" "perf randread 4096 32" "perf seqread 1048576 $QD_SEQ" \
    "fio randread 4096 1" "fio randread 4096 32" "fio randwrite 4096 1" "fio randwrite 4096 32" \
    "bw randread 4096 1" "bw randread 4096 32" "bw randwrite 4096 32" \
    "bw seqread 1048576 $QD_SEQ" "bw seqwrite 1048576 $QD_SEQ" \
    "py randread 4096 1 one" "py randread 4096 1 two" "py randwrite 4096 1 one" "py randwrite 4096 1 two" \
    "perf randread 4096 1 one" "perf randread 4096 1 two" \
    "fio randread 4096 1 one" "fio randread 4096 1 two" "fio randwrite 4096 1 one" "fio randwrite 4096 1 two" \
    "bw randread 4096 1 one" "bw randread 4096 1 two"; do
    if [ -n "${ONLY:-}" ] && ! [[ $spec =~ $ONLY ]]; then continue; fi
    read -r tool w xfer qd place <<<"$spec"
    place=${place:-free}
    read -r bi bm bc ti tm tc br bidle tr tidle bound bound_ratio bcl tcl ceil ceil_ratio row_lo \
        <<<"$(measure "$tool" "$w" "$xfer" "$qd" "$place")"
    case $tool in
    py) client=libiscsi_rw.py ;;
    perf) client=iscsi-perf ;;
    fio) client="fio+qemu-nbd" ;;
    bw) client="blockwire bench" ;;
    esac
    label="$w $((xfer / 1024))KiB qd$qd ($client)"
    case $place in
    one) label+=" [one CPU]" ;;
    two) label+=" [two CPUs]" ;;
    esac
    if [ "$xfer" = 1048576 ]; then seq_rows+=("$label|$bm|$tm|$row_lo"); fi
    # A pinned run leaves CPUs idle by design: its rest and bound would not say what they say
    # of a free run.
    [ "$place" = free ] && rest_rows+=("$label|$br|$bidle|$tr|$tidle|$bound|$bound_ratio|$bcl|$tcl|$ceil_ratio")
    iops_ratio=$(ratio "$bi" "$ti") cpu_ratio=$(ratio "$bc" "$tc")
    goal_rows+=("rows|$label|$xfer|$qd|$iops_ratio|$cpu_ratio|$bound_ratio|$bidle|$bcl|$ceil_ratio")
    printf '%-*s | %10s %9s %8s | %10s %9s %8s | %6s %6s\n' "$LW" "$label" "$bi" "$bm" "$bc" \
        "$ti" "$tm" "$tc" "$iops_ratio" "$cpu_ratio" | tee -a "$results"
done
echo "ratio = blockwire IOPS / tgtd IOPS (>1: blockwire faster); cpu = blockwire CPU per I/O / tgtd's (<1: blockwire cheaper)"
echo "[one CPU]: client and target pinned to CPU 0; [two CPUs]: target on CPU 0, client on CPU $((NCPU - 1)) (taskset)"
{
    echo
    echo "The rest of the machine's CPU ($NCPU CPUs; clients and the kernel work they cause), per I/O, and its idle share;"
    echo "bound = IOPS with blockwire's CPU at zero and the rest per I/O unchanged ($NCPU x 1e6 / rest us/io), and that over tgtd's IOPS;"
    echo "client% = the client process's CPU time over the run, in % of one CPU (fio rows: the qemu-nbd that fio drives, the"
    echo "busiest link of that chain); client ceil/tgtd = blockwire's IOPS over its client's busy share (the rate at which that"
    echo "client, at its CPU per I/O of this run, would use a whole CPU: how far a client on one thread can go), over tgtd's IOPS"
    printf '%-*s | %12s %6s %7s | %12s %6s %7s | %10s %10s | %7s\n' "$LW" workload "bw rest us" "idle%" "client%" \
        "tgtd rest us" "idle%" "client%" "bound IOPS" "bound/tgtd" "client ceil/tgtd"
    for r in "${rest_rows[@]}"; do
        IFS='|' read -r label br bidle tr tidle bound bound_ratio bcl tcl ceil_ratio <<<"$r"
        printf '%-*s | %12s %6s %7s | %12s %6s %7s | %10s %10s | %7s\n' "$LW" "$label" "$br" "$bidle" "$bcl" "$tr" \
            "$tidle" "$tcl" "$bound" "$bound_ratio" "$ceil_ratio"
    done
} | tee -a "$results"

lo=$(loopback)
lo_file=$(loopback_file "$tmp/tgtd-lun.img")
pair_hot=$(timeout $((SECS + 60)) "$pair" --hot --buffers "$QD_SEQ" --secs "$SECS") || pair_hot=-
pair_sendfile=$(timeout $((SECS + 60)) "$pair" --file "$tmp/tgtd-lun.img" --buffers "$QD_SEQ" --secs "$SECS") || pair_sendfile=-
# The pair the 1 MiB rows are set against: the LUN file sent the way blockwire sends it to an
# initiator on this host (copying sends from the file's mapping).
pair_file=$(timeout $((SECS + 60)) "$pair" --file "$tmp/tgtd-lun.img" --mapped --buffers "$QD_SEQ" --secs "$SECS") || pair_file=-
# Each 1 MiB row over the three loopback rates, worked out here rather than in the piped block
# below, which runs in a subshell: the READ rows also go to the goals.
seq_lines=()
for r in "${seq_rows[@]}"; do
    IFS='|' read -r label bm tm row_lo <<<"$r"
    bw_lo=$(ratio "$bm" "$lo") bw_file=$(ratio "$bm" "$lo_file") bw_pair=$(ratio "$bm" "$pair_file")
    bw_row_lo=$(ratio "$bm" "$row_lo")
    seq_lines+=("$(printf '%-*s | %9s %13s %13s | %12s %13s | %12s %12s | %12s %12s' "$LW" "$label" "$row_lo" "$bw_row_lo" \
        "$(ratio "$tm" "$row_lo")" "$bw_lo" "$(ratio "$tm" "$lo")" "$bw_file" "$(ratio "$tm" "$lo_file")" "$bw_pair" \
        "$(ratio "$tm" "$pair_file")")")
    if [[ $label == seqread* ]]; then
        goal_rows+=("seq|$label|$bw_row_lo|$bw_lo|$bw_file|$bw_pair")
    fi
done
{
    echo
    echo "loopback (iperf3, one TCP stream over 127.0.0.1, 1 MiB writes of one buffer, ${SECS} s): $lo MB/s"
    echo "loopback of a 1 GiB LUN file's bytes (iperf3 -Z -F tgtd's LUN file in /dev/shm, read into its buffer and sent, ${SECS} s): $lo_file MB/s"
    echo "bare pair, receiver keeping $QD_SEQ x 1 MiB buffers (loopback_pair, ${SECS} s): one hot buffer sent by write: $pair_hot MB/s; the LUN file sent by sendfile: $pair_sendfile MB/s, by copying sends from its mapping: $pair_file MB/s"
    printf '%-*s | %9s %13s %13s | %12s %13s | %12s %12s | %12s %12s\n' "$LW" "1 MiB rows / loopback" "rounds lo" \
        "bw / rounds" "tgtd / rounds" "bw / iperf3" "tgtd / iperf3" "bw / file lo" "tgtd / file" "bw / pair" "tgtd / pair"
    [ ${#seq_lines[@]} -gt 0 ] && printf '%s\n' "${seq_lines[@]}"
    echo "rounds lo: iperf3 (as above) in each of the row's rounds beside the two targets, MB/s; bw / rounds, tgtd / rounds: each target's rate over it"
    echo "bw / iperf3, tgtd / iperf3: over the one iperf3 run above; bw / pair, tgtd / pair: over the bare pair sending the LUN file (copying sends from its mapping) to $QD_SEQ x 1 MiB receive buffers"
} | tee -a "$results"

# --- QEMU read-back (see the header)
python3 - "$RB_MIB" "$RB_LUN_MIB" "$tmp/rb-write.txt" "$tmp/rb-read.txt" <<'PY'
import random, sys
total, lun_mib, wpath, rpath = int(sys.argv[1]) << 20, int(sys.argv[2]), sys.argv[3], sys.argv[4]
r = random.Random(14)
slots = list(range((lun_mib << 20) // 65536))  # one block per 64 KiB slot: no overlaps
r.shuffle(slots)
blocks, done = [], 0
for s in slots:
    if done >= total:
        break
    n = min(r.randrange(1, 17) * 4096, total - done)
    at = s * 65536 + r.randrange(0, (65536 - n) // 4096 + 1) * 4096
    blocks.append((at, n, len(blocks) % 251 + 1))
    done += n
with open(wpath, "w") as w, open(rpath, "w") as rd:
    for at, n, pat in blocks:
        w.write(f"write -q -P {pat} {at} {n}\n")
        rd.write(f"read -q -P {pat} {at} {n}\n")
PY
# blockwire's READ payload copy counter (see the header), bytes
bw_copies() {
    blockwire_metric_sum "$metrics_port" blockwire_read_path_copy_bytes_total \
        'kind="user_copied"' 'kind="read_to_user"' 'kind="sent_from_user"' 'kind="zc_copied"'
}
io_bytes() { awk '/^rchar|^wchar/ { s += $2 } END { printf "%.0f\n", s }' "/proc/$1/io"; }
now() { date +%s.%N; }
# qemu_io TARGET URL INPUT — fails on an error or a pattern mismatch
qemu_io() {
    local out
    out=$(timeout 600 qemu-io -f raw "$2" <"$3" 2>&1) || { echo "$1: qemu-io failed: $out" >&2; return 1; }
    if grep -qiE 'fail|error|mismatch' <<<"$out"; then
        echo "$1: qemu-io: $(grep -iE 'fail|error|mismatch' <<<"$out" | head -n 3)" >&2
        return 1
    fi
}
{
    echo
    echo "QEMU read-back: $RB_MIB MiB of random 4-64 KiB blocks written by qemu-io, read back and checked by a new qemu-io (one command at a time), $ROUNDS rounds"
    printf '%-10s | %9s %9s %6s | %9s %9s | %10s %10s\n' target "wr MB/s" "rd MB/s" "rd/wr" \
        "wr cp/B" "rd cp/B" "wr us/MiB" "rd us/MiB"
} | tee -a "$results"
# readback_round TARGET — one write pass and one read-back pass; prints
# "write_secs read_secs write_copied read_copied write_ticks read_ticks"
readback_round() {
    local t=$1 portal iqn pid url count a b i0 i1 i2 c0 c1 c1r c2 t0 t1 t1r t2
    read -r portal iqn _ pid <<<"${T[$t]}"
    url="iscsi://$portal/$iqn/${RB_LUN[$t]}"
    a=$(now)
    qemu_io "$t" "$url" /dev/null || return 1
    b=$(now)
    count=io_bytes
    [ "$t" = blockwire ] && count=bw_copies
    # Each phase's clock and CPU ticks cover its qemu-io alone: the copy count (blockwire: a
    # scrape of its metrics, some 0.2 s of python) is read outside both.
    i0=$($count "$pid") c0=$(cpu_ticks "$pid") t0=$(now)
    qemu_io "$t" "$url" "$tmp/rb-write.txt" || return 1
    t1=$(now) c1=$(cpu_ticks "$pid")
    i1=$($count "$pid") c1r=$(cpu_ticks "$pid") t1r=$(now)
    qemu_io "$t" "$url" "$tmp/rb-read.txt" || return 1
    t2=$(now) c2=$(cpu_ticks "$pid")
    i2=$($count "$pid")
    # Minus the login-and-logout time of a qemu-io session.
    awk -v a="$a" -v b="$b" -v t0="$t0" -v t1="$t1" -v t1r="$t1r" -v t2="$t2" \
        'BEGIN { l = b - a; printf "%.6f %.6f ", t1 - t0 - l, t2 - t1r - l }'
    echo "$((i1 - i0)) $((i2 - i1)) $((c1 - c0)) $((c2 - c1r))"
}
declare -A RB=()
for r in $(seq "$ROUNDS"); do
    order="blockwire tgtd"
    [ $((r % 2)) = 0 ] && order="tgtd blockwire"
    for t in $order; do
        if out=$(readback_round "$t"); then
            RB[$t]="${RB[$t]:-} $out"
        else
            RB[$t]="failed"
        fi
    done
done
for t in blockwire tgtd; do
    if [[ ${RB[$t]} == *failed* ]]; then
        echo "$t: qemu-io failed (see above)" | tee -a "$results"
        continue
    fi
    # shellcheck disable=SC2086 # the sums' fields, six per round
    line=$(python3 -c 'import sys
t, hz, mib, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
rounds = [v[i:i + 6] for i in range(0, len(v), 6)]
w, r = (sum(float(x[k]) for x in rounds) for k in (0, 1))
wc, rc, wt, rt = (sum(int(x[k]) for x in rounds) for k in (2, 3, 4, 5))
payload = (mib << 20) * len(rounds)
w, r = max(w, 1e-6), max(r, 1e-6)
wcp = "n/a" if t == "blockwire" else f"{wc / payload:.2f}"
print(f"{t:<10} | {payload / w / 1e6:9.1f} {payload / r / 1e6:9.1f} {w / r:6.2f} | "
      f"{wcp:>9} {rc / payload:9.2f} | "
      f"{wt / hz / (mib * len(rounds)) * 1e6:10.0f} {rt / hz / (mib * len(rounds)) * 1e6:10.0f}")
print(f"{w / r:.2f}|{rc / payload:.2f}")' \
        "$t" "$HZ" "$RB_MIB" ${RB[$t]})
    # First line: the table row; second: read/write rate and read copies per byte, for the goals.
    echo "${line%%$'\n'*}" | tee -a "$results"
    [ "$t" = blockwire ] && goal_rows+=("readback|${line#*$'\n'}")
done
echo "rd/wr = read rate / write rate; cp/B = copies per payload byte (tgtd: rchar+wchar; blockwire: its READ copy counter; see the script's header); us/MiB = target CPU per MiB of payload" | tee -a "$results"

# --- This run against the goals the benchmark was written for, row by row.
goals_summary() {
    printf '%s\n' "${goal_rows[@]}" | python3 -c 'import sys
def num(x):
    try:
        return float(x)
    except ValueError:
        return None
lines, met, total = [], 0, 0
def row(goal, label, value, ok, why=""):
    global met, total
    total += 1
    met += bool(ok)
    verdict = "met" if ok else "NOT met" + (f" ({why})" if why else "")
    lines.append(f"{goal:<24} | {label:<50} | {value:<40} | {verdict}")
for rec in sys.stdin.read().splitlines():
    f = rec.split("|")
    if f[0] == "rows":
        label, xfer, qd, r, cpu, bound, idle, client, ceiling = f[1:]
        r, cpu, bound, idle, client, ceiling = num(r), num(cpu), num(bound), num(idle), num(client), num(ceiling)
        if xfer != "4096" or r is None:
            continue
        if qd == "1":
            row("QD1 >= 1x IOPS", label, f"{r:.2f}x IOPS", r >= 1.0)
        elif qd == "32":
            ok = r >= 2.0 and cpu is not None and cpu <= 0.5
            why = []
            if r < 2.0:
                miss = "IOPS"
                if bound:
                    miss += f"; bound at zero target CPU: {bound:.2f}x"
                # CPUs left idle while the client ran flat out: it, not the target, set the pace.
                if idle is not None and idle >= 20:
                    miss += f"; machine {idle:.0f}% idle"
                # A client on one thread that used nearly all of a CPU set the pace itself.
                if client is not None and client >= 90 and ceiling:
                    miss += f"; client at {client:.0f}% of a CPU, its ceiling {ceiling:.2f}x"
                why.append(miss)
            if cpu is None or cpu > 0.5:
                why.append("CPU")
            cpu_text = f"{cpu:.2f}x" if cpu is not None else "?"
            row("QD32 >= 2x, <= 0.5x CPU", label, f"{r:.2f}x IOPS, {cpu_text} CPU per I/O", ok, "; ".join(why))
    elif f[0] == "seq":
        label, rounds_lo, lo, lo_file, pair = f[1], num(f[2]), num(f[3]), num(f[4]), num(f[5])
        # The goal against iperf3 in the rounds of the row itself; the one iperf3 run only if those failed.
        yardstick = rounds_lo if rounds_lo else lo
        if yardstick is None:
            continue
        value = (f"{yardstick:.2f}x iperf3" + (" of its rounds" if rounds_lo else "")
                 + (f", {lo:.2f}x one run" if rounds_lo and lo else "")
                 + (f", {lo_file:.2f}x file lo" if lo_file else "") + (f", {pair:.2f}x pair" if pair else ""))
        row("1 MiB >= 0.95x iperf3", label, value, yardstick >= 0.95)
    elif f[0] == "readback":
        rdwr, cp = num(f[1]), num(f[2])
        if rdwr is not None and cp is not None:
            row("read-back >= 0.8x, <= 2", "QEMU read-back (blockwire)", f"{rdwr:.2f}x write rate, {cp:.2f} copies/B", rdwr >= 0.8 and cp <= 2.0)
print()
print("Against the goals: 4 KiB QD32 >= 2x tgtd IOPS at <= 0.5x its CPU per I/O; QD1 IOPS at or above tgtd (mean latency at or below);")
print("1 MiB READ >= 0.95x the loopback rate (iperf3); QEMU read-back >= 0.8x its write rate at <= 2 copies per payload byte")
print(" | ".join(["goal".ljust(24), "row".ljust(50), "this run (ratios to tgtd or loopback)".ljust(40), "verdict"]))
for l in lines:
    print(l)
print(f"{met} of {total} rows meet their goal")'
}
goals_summary | tee -a "$results"

mkdir -p "$here/results"
{
    echo "# Benchmark: blockwire vs tgtd (libiscsi and QEMU clients)"
    echo
    echo "Generated by \`interop/bench-vs-tgtd.sh\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $(uname -r)), ${ROUNDS} rounds of ${SECS} s per workload and target (order swapped each round), 1 GiB LUN backed by /dev/shm on both (blockwire backstore: $BW_BACKSTORE; tgtd: rdwr file), whole LUN written once before the runs. blockwire: ${BLOCKWIRE_BIN:+binary $BLOCKWIRE_BIN (BLOCKWIRE_BIN; its commit is not known to the script), }release build of $(date -u -r "$bin" +%H:%M) UTC, repository HEAD $(git -C "$here/.." rev-parse --short HEAD 2>/dev/null || echo "?") at run time. Client and targets share the machine's $(nproc) cores. us/io = target CPU (user+system, all threads) per I/O in microseconds."
    if [ -n "${BENCH_NOTE:-}" ]; then
        echo
        echo "$BENCH_NOTE"
    fi
    echo
    echo "Machine at the start of the run:"
    echo
    echo '```'
    cat "$tmp/load.txt"
    echo '```'
    echo
    echo '```'
    cat "$results"
    echo '```'
    echo
    echo "ratio = blockwire IOPS / tgtd IOPS (>1: blockwire faster); cpu = blockwire us/io / tgtd us/io (<1: blockwire cheaper). libiscsi_rw.py = libiscsi's async API from Python (reads and writes); iscsi-perf = libiscsi's C read benchmark; blockwire bench = blockwire's own initiator (reads and writes); fio+qemu-nbd = fio's nbd engine against qemu-nbd exporting the LUN through QEMU's iscsi driver. QD1 ratio >= 1 means blockwire's mean latency is at or below tgtd's; [one CPU]: client and target pinned to CPU 0, [two CPUs]: target on CPU 0 and client on the other (taskset), since on a virtual machine where the scheduler places the two decides a QD1 round trip more than either program does."
} >"$here/results/bench-vs-tgtd.md"
echo "written: $here/results/bench-vs-tgtd.md"
