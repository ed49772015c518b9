#!/usr/bin/env bash
# bench/profile-protection.sh — where blockwire-target spends its CPU serving 1 MiB sequential
# I/O to a plain or a protected (T10 protection information, Type 1) file LUN: one target
# serving both LUNs as interop/bench-protection.sh does (1 GiB files in /dev/shm), the first
# SPAN of the chosen LUN written once, then `blockwire bench` at QD 8 on it while `perf record`
# samples the target for SECS seconds; prints the bench's line and perf's top symbols (self
# time, no call graph).
#
# interop/bench-protection.sh says how much a protected LUN costs; this says where: the copies
# (_copy_to_iter: the page cache into the core's buffer; _copy_from_iter: that buffer into the
# socket), the guard CRC (blockwire_target::scsi::guard_crc), page faults on fresh buffers.
# A profile, not a benchmark: perf's sampling costs the target a little, so its rates are not
# for comparison.
#
#   LUN=0|1         0 plain, 1 protected (default 1)
#   OP=read|write   (default read)
#   SECS=N          seconds of sampling (default 8; the bench runs SECS + 4)
#   SPAN=SIZE       bytes of the LUN the bench covers (default 256M)
#   TOP=N           symbols printed (default 15)
#   PERF_DATA=FILE  where perf writes (default a temporary file, removed at the end)
#   BLOCKWIRE_BIN   another blockwire-target binary (an older commit's, for before/after)
# Needs perf (Debian's linux-perf), run as root. Do not run it beside a build or a benchmark.
set -euo pipefail
here=$(cd "$(dirname "$0")/../interop" && pwd)
. "$here/lib/blockwire.sh"
LUN=${LUN:-1}
OP=${OP:-read}
SECS=${SECS:-8}
SPAN=${SPAN:-256M}
TOP=${TOP:-15}
IQN=iqn.2026-12.io.blockwire:profile-protection
case "$LUN" in 0 | 1) ;; *) echo "LUN must be 0 (plain) or 1 (protected), not '$LUN'" >&2; exit 2 ;; esac
case "$OP" in read | write) ;; *) echo "OP must be read or write, not '$OP'" >&2; exit 2 ;; esac
command -v perf >/dev/null || { echo "perf not found: apt-get install linux-perf" >&2; exit 1; }

cli=$(blockwire_cli)
blockwire_bin >/dev/null
tmp=$(mktemp -d)
shm=$(mktemp -d /dev/shm/blockwire-bench-pi.XXXXXX)
data=${PERF_DATA:-$tmp/perf.data}
pid="" bench_pid=""
cleanup() {
    [ -n "$bench_pid" ] && kill "$bench_pid" 2>/dev/null || true
    [ -n "$pid" ] && { stop_blockwire "$pid" 2>/dev/null || true; }
    rm -rf "$tmp" "$shm"
}
trap cleanup EXIT

blockwire_plain_and_protected_config "$tmp/target.toml" "$IQN" "$shm" 1G
port=$(free_port)
pid=$(start_blockwire "$port" "$tmp" "$tmp/target.toml")
url="iscsi://127.0.0.1:$port/$IQN/$LUN"

span_bytes=$(numfmt --from=iec "$SPAN")
echo "==== profile-protection: LUN $LUN ($([ "$LUN" = 1 ] && echo protected || echo plain)), 1 MiB $OP, QD 8, $SPAN, $SECS s of samples"
head -c "$span_bytes" /dev/urandom >"$tmp/fill.bin"
timeout 300 "$cli" dd if="$tmp/fill.bin" of="$url" bs=1M status=none
rm -f "$tmp/fill.bin"

timeout $((SECS + 60)) "$cli" bench -p "127.0.0.1:$port" -T "$IQN" --lun "$LUN" --pattern seq \
    --op "$OP" --bs 1M --qd 8 --time "$((SECS + 4))s" --span "$SPAN" >"$tmp/bench.out" 2>&1 &
bench_pid=$!
sleep 2
timeout $((SECS + 60)) perf record -q -F 999 -p "$pid" -o "$data" -- sleep "$SECS"
if ! wait "$bench_pid"; then
    bench_pid=""
    echo "FAIL: blockwire bench on LUN $LUN: $(cat "$tmp/bench.out")" >&2
    exit 1
fi
bench_pid=""
grep -E "IOPS=" "$tmp/bench.out"
perf report -i "$data" --no-children --sort symbol 2>/dev/null |
    grep -v '^#' | grep -v '^$' | head -n "$TOP" | sed -E 's/ +$//; s/ +- +-$//'
