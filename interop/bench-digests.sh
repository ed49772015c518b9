#!/usr/bin/env bash
# interop/bench-digests.sh — what CRC32C digests (RFC 7143 §12.1: HeaderDigest and DataDigest)
# cost a blockwire session: one blockwire-target serving a 1 GiB file LUN in /dev/shm (page
# cache, the sendfile READ road), `blockwire bench` against it with digests off and with
# HeaderDigest=CRC32C and DataDigest=CRC32C, alternating, ROUNDS rounds of SECS seconds per
# workload. Prints MB/s both ways, digests on / off, and the target's CPU time per I/O both ways.
#
#   SECS=5 ROUNDS=3          seconds per run, rounds per workload
#   BLOCKWIRE_BIN=path       another blockwire-target build (an older commit's, for before/after)
#
# The client computes and checks digests too, on the same 2 CPUs: the ratio is the session's,
# client and target together. Results: interop/results/bench-digests.md. Do not run it beside a
# build or another benchmark.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-3}
IQN=iqn.2026-12.io.blockwire:bench-digests

cli=$(blockwire_cli)
blockwire_bin >/dev/null
tmp=$(mktemp -d)
shm=$(mktemp -d /dev/shm/blockwire-bench-digests.XXXXXX)
pid=""
cleanup() {
    [ -n "$pid" ] && { stop_blockwire "$pid" 2>/dev/null || true; }
    rm -rf "$tmp" "$shm"
}
trap cleanup EXIT

blockwire_file_config "$tmp/target.toml" "$IQN" "$shm/lun.img" 1G
printf '\n[control]\nsocket = "%s"\n' "$tmp/control.sock" >>"$tmp/target.toml"
port=$(free_port)
pid=$(start_blockwire "$port" "$tmp" "$tmp/target.toml")
hz=$(getconf CLK_TCK)

# bench DIGESTS PATTERN OP BS QD SECS: "MB/s IOPS" of one run (DIGESTS: on or off).
bench() {
    local flags=()
    [ "$1" = on ] && flags=(--header-digest --data-digest)
    blockwire_bench_rates "digests $1, $2 $3 $4 qd $5" "$6" -p "127.0.0.1:$port" -T "$IQN" \
        "${flags[@]}" --pattern "$2" --op "$3" --bs "$4" --qd "$5"
}

measured="blockwire-target $(git -C "$here/.." rev-parse --short HEAD)"
[ -n "${BLOCKWIRE_BIN:-}" ] && measured="blockwire-target $BLOCKWIRE_BIN (BLOCKWIRE_BIN)"
echo "==== bench-digests: $measured, $(nproc) CPUs ($(grep -m 1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), SECS=$SECS ROUNDS=$ROUNDS"
echo "---- the LUN written once, whole, so every READ finds data"
head -c 1G /dev/urandom >"$tmp/fill.bin"
timeout 300 "$cli" dd if="$tmp/fill.bin" of="iscsi://127.0.0.1:$port/$IQN/0" bs=1M status=none
rm -f "$tmp/fill.bin"
# The sessions really digest: what the target negotiated, asked while one runs.
"$cli" bench -p "127.0.0.1:$port" -T "$IQN" --header-digest --data-digest --pattern seq --op read \
    --bs 4k --qd 1 --time 3s >/dev/null 2>&1 &
probe=$!
sleep 1.5
params=$("$(blockwire_bin)" ctl --control "$tmp/control.sock" session.list 2>&1 | tr -d ' \n')
wait "$probe" || { echo "FAIL: a session with digests did not run" >&2; exit 1; }
case $params in
*'"data_digest":"Crc32c"'*'"header_digest":"Crc32c"'*) echo "---- a session with --header-digest --data-digest: HeaderDigest and DataDigest CRC32C (session.list)" ;;
*) echo "FAIL: the digest session did not negotiate CRC32C digests: $params" >&2; exit 1 ;;
esac

printf '%-26s %12s %12s %9s %14s %14s\n' workload "off MB/s" "on MB/s" "on/off" "off CPU us/IO" "on CPU us/IO"
for w in "rand read 4k 32" "rand write 4k 32" "seq read 1M 8" "seq write 1M 8"; do
    read -r pattern op bs qd <<<"$w"
    declare -A mb=() ios=() ticks=()
    for d in off on; do mb[$d]=0 ios[$d]=0 ticks[$d]=0; done
    for round in $(seq 1 "$ROUNDS"); do
        for d in off on; do
            t0=$(cpu_ticks "$pid")
            read -r m i < <(bench "$d" "$pattern" "$op" "$bs" "$qd" "$SECS")
            t1=$(cpu_ticks "$pid")
            mb[$d]=$(python3 -c "print(${mb[$d]} + $m)")
            ios[$d]=$(python3 -c "print(${ios[$d]} + $i * $SECS)")
            ticks[$d]=$((ticks[$d] + t1 - t0))
        done
    done
    python3 - "$w" "$ROUNDS" "$hz" "${mb[off]}" "${mb[on]}" "${ios[off]}" "${ios[on]}" "${ticks[off]}" "${ticks[on]}" <<'PY'
import sys
w, rounds, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
mb0, mb1, io0, io1 = (float(x) for x in sys.argv[4:8])
t0, t1 = (int(x) for x in sys.argv[8:10])
p, q = mb0 / rounds, mb1 / rounds
us = lambda t, n: t / hz * 1e6 / n if n else float("nan")
pattern, op, bs, qd = w.split()
print(f"{'bs ' + bs + ' ' + pattern + ' ' + op + ' qd ' + qd:<26} "
      f"{p:12.1f} {q:12.1f} {q / p:8.2f}x {us(t0, io0):14.1f} {us(t1, io1):14.1f}")
PY
done
echo "(on/off: MB/s with HeaderDigest and DataDigest CRC32C over MB/s without, mean of $ROUNDS rounds of ${SECS} s each; CPU: blockwire-target's user + system time per I/O)"
