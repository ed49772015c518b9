#!/usr/bin/env bash
# bench/client-syscalls.sh — what a one-threaded client does per 4 KiB I/O against blockwire and
# against tgtd: its system calls per I/O by kind and its CPU time per I/O, at queue depth QD
# (default 32). A client on one thread that is busy all the time sets the pace itself, and no
# target takes it further unless the client's own work per I/O gets cheaper; this shows how much
# of that work depends on the target at all.
#
# Clients (each against each target's 1 GiB file LUN in /dev/shm, filled with random data first):
#   - fio+qemu-nbd: fio's nbd engine driving a qemu-nbd that exports the LUN through QEMU's iscsi
#     driver (libiscsi), as in interop/bench-vs-tgtd.sh; the counts are qemu-nbd's, the busiest
#     link of that chain (its I/Os: fio's completed count).
#   - libiscsi_rw.py: libiscsi's async API from Python (interop/libiscsi_rw.py); the counts are the
#     whole process's, its login included.
# Each workload runs twice per target, SECS (default 5) each, the targets alternating: once plain
# (IOPS and the client's CPU per I/O, from /proc/PID/stat), once under `perf stat` counting the
# client's system-call tracepoints (perf's own cost is in that run's rate, so it is not printed),
# and the target's system calls over the same run (`perf stat -p`: the threads the target has when
# the run starts, which for blockwire are its connection threads and for tgtd its event loop and
# its backing store's workers), to show what is left for io_uring to take off the target's side.
# The plain run also reads the scheduler's account of the client's main thread
# (/proc/PID/task/PID/schedstat) from 1 s after the start to 1 s before the end, and splits that
# wall time three ways: on a CPU, runnable but waiting for one (behind the target, fio or anything
# else on the run queue), and asleep (waiting for a reply, which is where a slow target would show).
# A client that is on a CPU nearly all the time and asleep almost never is not waiting for its
# target.
# Env: SECS, QD, BLOCKWIRE_BIN (another blockwire-target binary). Needs perf (linux-perf), fio,
# qemu-nbd (qemu-utils, qemu-block-extra), tgtd and libiscsi's Python binding as the interop
# scripts do; run as root (tracepoints).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
interop=$repo/interop
# bench/lib.sh for fill_random; interop's libraries after it, so that their free_port (a port
# below 32768, which tgtd's control port needs) is the one in effect.
. "$here/lib.sh"
. "$interop/lib/blockwire.sh"

SECS=${SECS:-5}
QD=${QD:-32}
if ! [ "$SECS" -ge 3 ] 2>/dev/null; then
    echo "client-syscalls.sh: SECS must be a whole number of at least 3 (the scheduler window skips the first and last second)" >&2
    exit 2
fi
SIZE_MIB=1024
IQN_BW=iqn.2026-11.io.blockwire:client-syscalls
IQN_TGT=iqn.2026-11.io.tgtd:client-syscalls
# The system calls the clients make in their I/O loops (qemu-nbd: ppoll, eventfd write/read,
# NBD recvmsg/sendmsg, libiscsi's send/recv/readv; Python: poll, send, recv).
KINDS=(ppoll poll write read recvfrom recvmsg sendto sendmsg readv writev)
# The target's calls that read or write the LUN file (blockwire: preadv2 and pwrite64; tgtd's
# backing store: pread64 and pwrite64); the rest of its calls are its sockets' and its event loop's.
FILE_KINDS=(pread64 preadv preadv2 pwrite64 pwritev pwritev2)

for tool in perf fio qemu-nbd tgtd python3; do
    command -v "$tool" >/dev/null || { echo "client-syscalls.sh: $tool is missing" >&2; exit 1; }
done
tmp=$(mktemp -d /dev/shm/bw-client-syscalls.XXXXXX)
bw_pid="" tgt_pid="" tgt_port="" nbd_pids=()
cleanup() {
    stop_qemu_nbd "${nbd_pids[@]}"
    if [ -n "$bw_pid" ]; then stop_blockwire "$bw_pid" 2>/dev/null || true; fi
    stop_tgtd "$tgt_port" "$tgt_pid"
    rm -rf "$tmp"
}
trap cleanup EXIT

# $tmp/l0.img (blockwire's LUN) and $tmp/l1.img (tgtd's), random contents.
fill_random 0 1

bin=$(blockwire_bin)
bw_port=$(free_port)
blockwire_file_config "$tmp/target.toml" "$IQN_BW" "$tmp/l0.img" "${SIZE_MIB}M"
bw_pid=$(start_blockwire "$bw_port" "$tmp" "$tmp/target.toml")
tgt_port=$(free_port)
tgt_pid=$(start_tgtd "$tgt_port" "$tmp")
tgtd_new_target "$tgt_port" 1 "$IQN_TGT"
tgtd_add_lun "$tgt_port" 1 1 "$tmp/l1.img" "$SIZE_MIB"
declare -A T=([blockwire]="127.0.0.1:$bw_port $IQN_BW 0" [tgtd]="127.0.0.1:$tgt_port $IQN_TGT 1")
declare -A TARGET_PID=([blockwire]="$bw_pid" [tgtd]="$tgt_pid")

declare -A NBD NBD_PID
for t in blockwire tgtd; do
    read -r portal iqn lun <<<"${T[$t]}"
    NBD[$t]=$tmp/nbd-$t.sock
    NBD_PID[$t]=$(start_qemu_nbd "${NBD[$t]}" "iscsi://$portal/$iqn/$lun" "$tmp/qemu-nbd-$t.log")
    nbd_pids+=("${NBD_PID[$t]}")
done

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# sched_now PID — "wall_ns oncpu_ns runqueue_ns" for PID's main thread now (schedstat: time on a
# CPU, time runnable on a run queue; both in ns since the thread started)
sched_now() {
    local s
    read -r -a s <"/proc/$1/task/$1/schedstat"
    echo "$(date +%s%N) ${s[0]} ${s[1]}"
}
# sched_window PID — called 1 s after the client started: prints "oncpu% runq% asleep%" of PID's
# main thread over the next SECS - 2 s, the middle of the client's run
sched_window() {
    local a b
    a=$(sched_now "$1")
    sleep $((SECS - 2))
    b=$(sched_now "$1")
    awk -v a="$a" -v b="$b" 'BEGIN {
        split(a, x, " "); split(b, y, " "); wall = y[1] - x[1]
        on = 100 * (y[2] - x[2]) / wall; rq = 100 * (y[3] - x[3]) / wall
        printf "%.1f %.1f %.1f\n", on, rq, 100 - on - rq }'
}
HZ=$(getconf CLK_TCK)
events=raw_syscalls:sys_enter
for k in "${KINDS[@]}"; do events+=",syscalls:sys_enter_$k"; done
target_events=raw_syscalls:sys_enter
for k in "${FILE_KINDS[@]}"; do target_events+=",syscalls:sys_enter_$k"; done

# fio_ios JSON DIR — fio's completed I/O count and its run time in seconds
fio_ios() {
    python3 -c 'import json, sys
s = open(sys.argv[1]).read()
d = json.loads(s[s.index("{"):])["jobs"][0][sys.argv[2]]
print(d["total_ios"], d["runtime"] / 1000)' "$1" "$2"
}

# measure TARGET CLIENT WORKLOAD COUNTED — one SECS run; COUNTED=1: under perf stat, whose counts
# go to $tmp/perf.txt (the client's) and $tmp/perf-target.txt (the target's, from 0.5 s before the
# client starts until it has ended). Prints "ios secs client_ticks oncpu% runq% asleep%" (0 0 for a
# run that did no I/O; the last three "- - -" for a counted run).
measure() {
    local t=$1 client=$2 w=$3 counted=$4 portal iqn lun ios secs k0 k1 perf_pid="" run_pid
    local sched="- - -"
    read -r portal iqn lun <<<"${T[$t]}"
    rm -f "$tmp/perf.txt" "$tmp/perf-target.txt"
    local target_perf=""
    if [ "$counted" = 1 ]; then
        perf stat -x, -o "$tmp/perf-target.txt" -e "$target_events" -p "${TARGET_PID[$t]}" \
            >/dev/null 2>&1 &
        target_perf=$!
        sleep 0.5
    fi
    if [ "$client" = fio+qemu-nbd ]; then
        local nbd=${NBD_PID[$t]} dir=read
        [[ $w == *write ]] && dir=write
        if [ "$counted" = 1 ]; then
            perf stat -x, -o "$tmp/perf.txt" -e "$events" -p "$nbd" >/dev/null 2>&1 &
            perf_pid=$!
            sleep 0.5
        fi
        k0=$(ticks "$nbd")
        timeout $((SECS + 60)) fio --name=c --ioengine=nbd --uri="nbd+unix:///?socket=${NBD[$t]}" \
            --rw="$w" --bs=4k --iodepth="$QD" --size="${SIZE_MIB}M" --time_based --runtime="$SECS" \
            --norandommap --randrepeat=0 --output-format=json >"$tmp/fio.json" 2>/dev/null &
        run_pid=$!
        if [ "$counted" = 0 ]; then
            sleep 1
            sched=$(sched_window "$nbd")
        fi
        wait "$run_pid" || true
        k1=$(ticks "$nbd")
        if [ -n "$perf_pid" ]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; fi
        read -r ios secs < <(fio_ios "$tmp/fio.json" "$dir")
    else
        local -a py=(python3 "$interop/libiscsi_rw.py" "$portal" "$iqn" "$lun" --bench "$w"
            --xfer 4096 --qd "$QD" --seconds "$SECS" --span $((SIZE_MIB << 20)))
        local out st
        read -r -a st <"/proc/$BASHPID/stat"
        k0=$((st[15] + st[16]))
        if [ "$counted" = 1 ]; then
            out=$(timeout $((SECS + 60)) perf stat -x, -o "$tmp/perf.txt" -e "$events" -- "${py[@]}")
        else
            timeout $((SECS + 60)) "${py[@]}" >"$tmp/py.out" &
            run_pid=$!
            sleep 1
            local py_pid
            py_pid=$(pgrep -P "$run_pid" -x python3) || {
                echo "client-syscalls.sh: the Python client against $t is not running" \
                    "1 s after its start" >&2
                exit 1
            }
            sched=$(sched_window "$py_pid")
            wait "$run_pid" || true
            out=$(cat "$tmp/py.out")
        fi
        read -r -a st <"/proc/$BASHPID/stat"
        k1=$((st[15] + st[16]))
        ios=$(sed -n 's/.* ios=\([0-9]*\).*/\1/p' <<<"$out")
        secs=$(sed -n 's/.* secs=\([0-9.]*\).*/\1/p' <<<"$out")
    fi
    if [ -n "$target_perf" ]; then kill -INT "$target_perf"; wait "$target_perf" || true; fi
    echo "${ios:-0} ${secs:-0} $((k1 - k0)) $sched"
}

# count KIND [FILE] — the counted run's system calls of KIND ("" for all), from FILE (default: the
# client's counts, $tmp/perf.txt)
count() {
    local ev=raw_syscalls:sys_enter
    [ -n "$1" ] && ev=syscalls:sys_enter_$1
    awk -F, -v ev="$ev" '$3 == ev { print ($1 ~ /^[0-9]+$/) ? $1 : 0 }' "${2:-$tmp/perf.txt}"
}

echo "machine: $(nproc) CPUs, $(uname -r); blockwire $(git -C "$here/.." rev-parse --short HEAD) ($bin), tgtd $(tgtd -V 2>/dev/null | head -n 1 || true)"
echo "4 KiB random I/O at QD $QD, $SECS s per run; us/io = the client's CPU (user + system) per I/O; oncpu, runq, asleep = shares of the wall time its main thread was on a CPU, runnable waiting for one, and asleep (the middle $((SECS - 2)) s of the plain run); calls/io = its system calls per I/O, all and by kind (a counted run); tgt calls/io = the target's system calls per I/O in that run, all and those on the LUN file"
printf '%-14s %-10s %-9s | %8s %7s | %6s %6s %6s | %9s' client workload target IOPS us/io oncpu runq asleep calls/io
for k in "${KINDS[@]}"; do printf ' %8s' "$k"; done
printf ' | %9s %9s\n' "tgt calls" "tgt file"
for client in fio+qemu-nbd libiscsi_rw.py; do
    for w in randread randwrite; do
        for t in blockwire tgtd; do
            read -r ios secs ticks_used oncpu runq asleep < <(measure "$t" "$client" "$w" 0)
            read -r cios _ _ < <(measure "$t" "$client" "$w" 1)
            if [ "${ios:-0}" = 0 ] || [ "${secs:-0}" = 0 ] || [ "${cios:-0}" = 0 ]; then
                echo "client-syscalls.sh: $client $w against $t completed no I/O" >&2
                exit 1
            fi
            {
                echo "$ios $secs $ticks_used $HZ $cios $(count '') $oncpu $runq $asleep"
                for k in "${KINDS[@]}"; do echo "$(count "$k")"; done
                file=0
                for k in "${FILE_KINDS[@]}"; do file=$((file + $(count "$k" "$tmp/perf-target.txt"))); done
                echo "target $(count '' "$tmp/perf-target.txt") $file"
            } | awk -v row="$(printf '%-14s %-10s %-9s' "$client" "$w" "$t")" '
                NR == 1 { printf "%s | %8.0f %7.2f | %5s%% %5s%% %5s%% | %9.2f", row, $1 / $2, $3 * 1e6 / $4 / $1, $7, $8, $9, $6 / $5; cios = $5; next }
                $1 == "target" { printf " | %9.2f %9.2f", $2 / cios, $3 / cios; next }
                { printf " %8.2f", $1 / cios }
                END { print "" }'
        done
    done
done
