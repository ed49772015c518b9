#!/bin/bash
# bench/initiator-vs-iscsi-perf.sh — blockwire's initiator (`blockwire bench`) against libiscsi's
# `iscsi-perf` on the same tgtd LUN in one run; prints both and the ratio.
#
# Not run by CI (a benchmark). Release build of the blockwire CLI (built if missing). Waits
# (bounded) for running rustc processes first: a compile beside it distorts the numbers.
#
# Target: tgtd on a free 127.0.0.1 port, one LUN (LUN 1) backed by a 1 GiB file in /dev/shm,
# written once in full (blockwire dd) so reads hit written data.
# Workloads (SECS per run, default 5; REPS runs per client, default 3, interleaved, the order
# alternating from one run to the next; the table shows the run with the median IOPS of each
# client and the range of all runs — on a shared machine single runs vary a lot):
#   4 KiB random read QD 1, 4 KiB random read QD 32, 1 MiB sequential read QD $QD_SEQ (default 8)
#   blockwire bench --pattern rand|seq --op read --bs B --qd Q --time SECS
#   iscsi-perf [-r] -m Q -b B/512 -t SECS     (its "iops average N" line)
# Client CPU: user+system time of the client process (getrusage of the child) per I/O.
#
# Output: a table on stdout, also written to bench/results/initiator-vs-iscsi-perf.md.
# Env: SECS, REPS, QD_SEQ, SIZE_MIB (default 1024).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$repo/interop/lib/blockwire.sh"

SECS=${SECS:-5}
REPS=${REPS:-3}
QD_SEQ=${QD_SEQ:-8}
SIZE_MIB=${SIZE_MIB:-1024}
IQN=iqn.2026-11.io.tgtd:initiator-bench
LUN=1

command -v iscsi-perf >/dev/null || { echo "iscsi-perf missing (apt-get install libiscsi-bin)" >&2; exit 1; }
command -v tgtd >/dev/null || { echo "tgtd missing (apt-get install tgt)" >&2; exit 1; }

bw=$(blockwire_cli)
if pgrep -x rustc >/dev/null; then
    echo "waiting for a running cargo build (rustc) to finish..." >&2
    timeout 900 bash -c 'while pgrep -x rustc >/dev/null; do sleep 5; done' ||
        echo "WARNING: rustc still running; numbers will be noisy" >&2
fi

tmp=$(mktemp -d /dev/shm/bw-ibench.XXXXXX)
port="" tgt_pid=""
cleanup() {
    stop_tgtd "$port" "$tgt_pid"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

port=$(free_port)
tgt_pid=$(start_tgtd "$port" "$tmp")
tgtd_new_target "$port" 1 "$IQN"
tgtd_add_lun "$port" 1 "$LUN" "$tmp/lun.img" "$SIZE_MIB"
portal=127.0.0.1:$port
url=iscsi://$portal/$IQN/$LUN

echo "prefill: writing the whole ${SIZE_MIB} MiB LUN once" >&2
head -c "${SIZE_MIB}M" /dev/zero | tr '\0' 'Z' >"$tmp/fill"
timeout 300 "$bw" dd --if "$tmp/fill" --of "$url" --bs 1M --qd 8 --quiet >&2
rm -f "$tmp/fill"

# cpu_of CMD... — runs CMD, its stdout to stdout; prints "CPUSECONDS" to fd 3.
cpu_of() {
    python3 -c '
import os, resource, subprocess, sys
p = subprocess.run(sys.argv[1:])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
os.write(3, f"{r.ru_utime + r.ru_stime:.4f}\n".encode())
sys.exit(p.returncode)' "$@"
}

# run blockwire|iscsi-perf PATTERN XFER QD — prints "IOPS MBps us_cpu_per_io p50_us"
run() {
    local who=$1 pattern=$2 xfer=$3 qd=$4 out cpu iops p50="-"
    if [ "$who" = blockwire ]; then
        out=$(cpu_of timeout $((SECS + 60)) "$bw" bench -p "$portal" -T "$IQN" -l "$LUN" \
            --pattern "$pattern" --op read --bs "$xfer" --qd "$qd" --time "${SECS}s" 3>"$tmp/cpu")
        iops=$(sed -n 's/^IOPS=\([0-9]*\).*/\1/p' <<<"$out")
        p50=$(sed -n 's/.* p50=\([0-9]*\).*/\1/p' <<<"$out")
    else
        local -a o=(-m "$qd" -b $((xfer / 512)) -t "$SECS")
        [ "$pattern" = rand ] && o+=(-r)
        out=$(cpu_of timeout -s INT $((SECS + 30)) iscsi-perf "${o[@]}" "$url" 2>&1 3>"$tmp/cpu" |
            tr '\r' '\n' || true)
        iops=$(grep -o 'iops average [0-9]*' <<<"$out" | tail -n 1 | grep -o '[0-9]*$' || true)
    fi
    cpu=$(cat "$tmp/cpu" 2>/dev/null || echo 0)
    if [ -z "$iops" ] || [ "$iops" = 0 ]; then
        echo "0 0 0 -"
        return
    fi
    python3 -c 'import sys
iops, xfer, cpu, secs = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
print(f"{iops:.0f} {iops * xfer / 1e6:.1f} {cpu / (iops * secs) * 1e6:.2f}", sys.argv[5])' \
        "$iops" "$xfer" "$cpu" "$SECS" "$p50"
}

ratio() { python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f"{a / b:.2f}" if b else "-")' "$1" "$2"; }

results=$tmp/results.txt
fmt='%-28s | %9s %8s %8s %7s | %9s %8s %8s | %6s %6s\n'
printf "$fmt" workload "bw IOPS" "bw MB/s" "bw us/io" "bw p50" "perf IOPS" "perf MB/s" "perf us/io" ratio cpu |
    tee "$results"
# median FIELD LINES... — the line whose FIELD-th number is the median of them (by IOPS).
median() {
    python3 -c 'import sys
rows = [l.split() for l in sys.argv[1:] if l.strip()]
rows.sort(key=lambda r: float(r[0]))
print(" ".join(rows[len(rows) // 2]) if rows else "0 0 0 -")' "$@"
}
spread() {
    python3 -c 'import sys
v = sorted(float(l.split()[0]) for l in sys.argv[1:] if l.strip())
print(f"{v[0]:.0f}..{v[-1]:.0f}" if v else "-")' "$@"
}

i=0
ranges=""
for spec in "rand 4096 1" "rand 4096 32" "seq 1048576 $QD_SEQ"; do
    read -r pattern xfer qd <<<"$spec"
    bws=() perfs=()
    for _ in $(seq 1 "$REPS"); do
        # Alternate which client goes first, from one run to the next.
        if [ $((i % 2)) = 0 ]; then
            bws+=("$(run blockwire "$pattern" "$xfer" "$qd")")
            perfs+=("$(run iscsi-perf "$pattern" "$xfer" "$qd")")
        else
            perfs+=("$(run iscsi-perf "$pattern" "$xfer" "$qd")")
            bws+=("$(run blockwire "$pattern" "$xfer" "$qd")")
        fi
        i=$((i + 1))
    done
    read -r bi bm bc bp <<<"$(median "${bws[@]}")"
    read -r pi pm pc _ <<<"$(median "${perfs[@]}")"
    label="$([ "$pattern" = rand ] && echo random || echo sequential) read $((xfer / 1024))KiB qd$qd"
    printf "$fmt" "$label" "$bi" "$bm" "$bc" "$bp" "$pi" "$pm" "$pc" "$(ratio "$bi" "$pi")" \
        "$(ratio "$bc" "$pc")" | tee -a "$results"
    ranges+="$label: blockwire IOPS $(spread "${bws[@]}"), iscsi-perf IOPS $(spread "${perfs[@]}")"$'\n'
done
printf 'IOPS range over the %s runs of each:\n%s' "$REPS" "$ranges" | tee -a "$results"
note="ratio = blockwire IOPS / iscsi-perf IOPS (>1: blockwire faster); cpu = blockwire client CPU per I/O / iscsi-perf's (<1: blockwire cheaper); p50 = blockwire's median latency in us"
echo "$note"

mkdir -p "$here/results"
{
    echo "# blockwire initiator vs libiscsi iscsi-perf (same tgtd LUN)"
    echo
    echo "Generated by \`bench/initiator-vs-iscsi-perf.sh\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $(uname -r)), ${SECS} s per run, median of ${REPS} interleaved runs per client, tgtd $(tgtd --version 2>/dev/null | head -n 1 || true) with a ${SIZE_MIB} MiB rdwr LUN in /dev/shm, written once before the runs. blockwire CLI: release build, HEAD $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo "?"). Clients and target share the machine's cores. us/io = client CPU (user+system) per I/O in microseconds."
    echo
    echo '```'
    cat "$results"
    echo '```'
    echo
    echo "$note."
} >"$here/results/initiator-vs-iscsi-perf.md"
echo "written: $here/results/initiator-vs-iscsi-perf.md"
