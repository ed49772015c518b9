#!/bin/bash
# interop/bench-protection.sh — what T10 protection information (Type 1) costs: one
# blockwire-target serving two 1 GiB file LUNs in /dev/shm, LUN 0 plain and LUN 1 with
# `protection = "type1"` (its tuples in a second /dev/shm file), the same workloads on both in
# one run, alternating LUN by LUN in each round; prints each LUN's MB/s, the ratio protected /
# plain, and the target's CPU time and minor page faults per I/O on each.
#
# Not run by CI (a benchmark: about 4 minutes with the defaults). Release builds of
# blockwire-target and the `blockwire` CLI (interop/lib/blockwire.sh builds them if missing).
# Client: `blockwire bench`, blockwire's own initiator (one session, one thread), the cheapest
# client here, so the difference between the LUNs is the target's. Do not run it beside a
# build or another benchmark.
#
# Why a protected LUN costs more: every READ checks a CRC-16 T10-DIF guard per 512-byte block
# and reads the tuples from their own file; every WRITE computes the guards and writes the
# tuples beside the blocks; and a protected LUN's READs go through the SCSI core's buffer, not
# the fabric's sendfile/engine roads (the core must see the bytes to check them). The faults
# column shows whether that buffer is fresh memory each command (a fault per 4 KiB page) or
# one kept between commands (target/src/payload_buffers.rs).
#
#   SECS=N     seconds per measurement (default 5)
#   ROUNDS=N   rounds per workload, the LUNs alternating in each (default 3)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-3}
IQN=iqn.2026-12.io.blockwire:bench-protection

cli=$(blockwire_cli)
blockwire_bin >/dev/null
tmp=$(mktemp -d)
shm=$(mktemp -d /dev/shm/blockwire-bench-pi.XXXXXX)
pid=""
cleanup() {
    [ -n "$pid" ] && { stop_blockwire "$pid" 2>/dev/null || true; }
    rm -rf "$tmp" "$shm"
}
trap cleanup EXIT

blockwire_plain_and_protected_config "$tmp/target.toml" "$IQN" "$shm" 1G
port=$(free_port)
pid=$(start_blockwire "$port" "$tmp" "$tmp/target.toml")

hz=$(getconf CLK_TCK)

# bench LUN PATTERN OP BS QD SECS: prints "MB/s IOPS".
bench() {
    blockwire_bench_rates "LUN $1 ($2 $3 $4 qd $5)" "$6" -p "127.0.0.1:$port" -T "$IQN" \
        --lun "$1" --pattern "$2" --op "$3" --bs "$4" --qd "$5"
}

# The binary measured: the checkout's own release build, or the one BLOCKWIRE_BIN names (an
# older commit's build, for a before/after run), which the header must not call HEAD.
measured="blockwire-target $(git -C "$here/.." rev-parse --short HEAD)"
[ -n "${BLOCKWIRE_BIN:-}" ] && measured="blockwire-target $BLOCKWIRE_BIN (BLOCKWIRE_BIN)"
echo "==== bench-protection: $measured, $(nproc) CPUs ($(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), SECS=$SECS ROUNDS=$ROUNDS"
echo "---- both LUNs written once, whole, with the same random bytes, so every READ finds data and tuples"
head -c 1G /dev/urandom >"$tmp/fill.bin"
for lun in 0 1; do
    timeout 300 "$cli" dd if="$tmp/fill.bin" of="iscsi://127.0.0.1:$port/$IQN/$lun" bs=1M status=none
done
rm -f "$tmp/fill.bin"

printf '%-26s %14s %14s %9s %15s %15s %13s %13s\n' workload "plain MB/s" "type1 MB/s" "ratio" "plain CPU us/IO" "type1 CPU us/IO" "plain flt/IO" "type1 flt/IO"
for w in "rand read 4k 32" "rand write 4k 32" "seq read 1M 8" "seq write 1M 8"; do
    read -r pattern op bs qd <<<"$w"
    declare -A mb=() ios=() ticks=() faults=()
    for lun in 0 1; do mb[$lun]=0 ios[$lun]=0 ticks[$lun]=0 faults[$lun]=0; done
    for round in $(seq 1 "$ROUNDS"); do
        for lun in 0 1; do
            t0=$(cpu_ticks "$pid")
            f0=$(minor_faults "$pid")
            read -r m i < <(bench "$lun" "$pattern" "$op" "$bs" "$qd" "$SECS")
            t1=$(cpu_ticks "$pid")
            f1=$(minor_faults "$pid")
            mb[$lun]=$(python3 -c "print(${mb[$lun]} + $m)")
            ios[$lun]=$(python3 -c "print(${ios[$lun]} + $i * $SECS)")
            ticks[$lun]=$((ticks[$lun] + t1 - t0))
            faults[$lun]=$((faults[$lun] + f1 - f0))
        done
    done
    python3 - "$w" "$ROUNDS" "$hz" "${mb[0]}" "${mb[1]}" "${ios[0]}" "${ios[1]}" "${ticks[0]}" "${ticks[1]}" "${faults[0]}" "${faults[1]}" <<'PY'
import sys
w, rounds, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mb0, mb1, io0, io1 = (float(x) for x in sys.argv[4:8])
t0, t1, f0, f1 = (int(x) for x in sys.argv[8:12])
p, q = mb0 / rounds, mb1 / rounds
us = lambda t, n: t / hz * 1e6 / n if n else float("nan")
print(f"{'bs ' + w.split()[2] + ' ' + w.split()[0] + ' ' + w.split()[1] + ' qd ' + w.split()[3]:<26} "
      f"{p:14.1f} {q:14.1f} {q / p:8.2f}x {us(t0, io0):15.1f} {us(t1, io1):15.1f} "
      f"{f0 / io0 if io0 else float('nan'):13.2f} {f1 / io1 if io1 else float('nan'):13.2f}")
PY
done
echo "(ratio: protected / plain, mean of $ROUNDS rounds of ${SECS} s each; CPU: blockwire-target's user + system time per I/O; flt: its minor page faults per I/O)"
# grep -c prints 0 and exits 1 when nothing matched: the count decides, not its status.
failures=$(grep -c "protection information check failed" "$tmp/blockwire-$port.log" || true)
if [ "$failures" = 0 ]; then
    echo "no protection information check failed"
else
    echo "FAIL: $failures protection information check failures logged"
    exit 1
fi
