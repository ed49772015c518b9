#!/usr/bin/env bash
# bench/one-mib-senders.sh — where the sending thread's CPU goes when one TCP connection over
# 127.0.0.1 carries 1 MiB writes, for the senders that interop/bench-vs-tgtd.sh sets its 1 MiB READ
# rows against and for blockwire itself:
#   iperf3        iperf3's client, `-l 1M`: one 1 MiB buffer sent again and again (it stays in
#                 the CPU caches), the bench's loopback rate;
#   pair hot      target/examples/loopback_pair --hot: the same, the receiver keeping 8 x 1 MiB
#                 buffers in turn as a client with 8 READs in flight does;
#   pair mapped   loopback_pair --file LUN --mapped: the 1 GiB LUN file sent by copying sends
#                 from its mapping, as blockwire sends to an initiator on this host;
#   pair splice   loopback_pair --file LUN --splice: the LUN file's page-cache pages passed by
#                 splice(2) through a 1 MiB pipe, so the sender copies nothing and the receiver
#                 copies the LUN's bytes out of the pages;
#   blockwire     blockwire-target serving that file as a LUN to `blockwire bench`, 1 MiB
#                 sequential READs at QD 8 (its connection thread).
# Over loopback the sender's thread also runs TCP's receive side for the other end, so a sender
# at a full CPU sets the rate. Each sender runs SECS (default 6) seconds; `perf record` samples
# its process for the middle SECS - 3 seconds, and the thread with the most samples (the sender)
# is reported: the rate, how busy that thread was, the shares of its samples in the kernel's copies
# from user memory into socket buffers (`_copy_from_iter`) and from socket buffers or spliced pages
# to user memory (`_copy_to_iter`), and its busiest kernel functions. For the pair, whose receiver
# is its main thread, both threads are reported ("send", "recv"). A hot buffer is
# copied from the CPU caches; the LUN's bytes, 1 GiB of them, are not in them. On a virtual
# machine without a PMU perf samples on a timer, so time spent with interrupts off shows up at
# the point they are enabled again (`_raw_spin_unlock_irqrestore`): read the shares as a
# comparison between the senders, not as exact costs.
# Env: SECS, BLOCKWIRE_BIN, BLOCKWIRE_CLI. Needs perf (linux-perf) and iperf3; run as root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib.sh"
. "$repo/interop/lib/blockwire.sh"

SECS=${SECS:-6}
[ "$SECS" -ge 4 ] || { echo "one-mib-senders.sh: SECS must be at least 4" >&2; exit 1; }
SIZE_MIB=1024
# Samples a second (perf record -F): a thread busy all the time gets this many.
HZ_SAMPLE=1000
IQN=iqn.2026-11.io.blockwire:one-mib
for tool in perf iperf3 python3; do
    command -v "$tool" >/dev/null || { echo "one-mib-senders.sh: $tool is missing" >&2; exit 1; }
done
tmp=$(mktemp -d /dev/shm/bw-one-mib.XXXXXX)
bw_pid="" srv=""
cleanup() {
    if [ -n "$srv" ]; then kill "$srv" 2>/dev/null || true; fi
    if [ -n "$bw_pid" ]; then stop_blockwire "$bw_pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

cli=$(blockwire_cli)
pair=$(loopback_pair_bin)
wait_for_rustc
fill_random 0

# profile PID [pair] — samples PID's threads for SECS - 3 s after a second's start; prints how
# busy the busiest thread was (its samples over those of a thread busy all the time), its shares
# in _copy_from_iter and _copy_to_iter and its five busiest functions. With "pair": a line for
# the busiest thread other than the main one (the pair's sender), then one for the main thread
# (its receiver), each behind a tab.
profile() {
    sleep 1
    perf record -q -F "$HZ_SAMPLE" -o "$tmp/perf.data" -p "$1" -- sleep $((SECS - 3)) >/dev/null 2>&1 || true
    perf script -i "$tmp/perf.data" -F tid,ip,sym 2>/dev/null | python3 -c 'import collections, sys
window, pid, mode = float(sys.argv[1]), sys.argv[2], sys.argv[3]
# One line a sample: thread, address, function (absent when perf cannot name it).
by_tid = collections.defaultdict(collections.Counter)
for line in sys.stdin:
    f = line.split()
    if len(f) >= 2:
        by_tid[f[0]][f[2] if len(f) > 2 else "[unknown]"] += 1
if not by_tid:
    print("no samples")
    sys.exit()
def line(counts):
    total = sum(counts.values())
    if not total:
        return "no samples"
    top = ", ".join(f"{s} {100 * n / total:.1f}%" for s, n in counts.most_common(5))
    copies = "; ".join(f"{f} {100 * counts[f] / total:.1f}%" for f in ("_copy_from_iter", "_copy_to_iter"))
    return f"{100 * total / window:.0f}% of a CPU; {copies}; {top}"
busiest = lambda tids: max(tids, key=lambda t: sum(by_tid[t].values()))
if mode == "pair":
    others = [t for t in by_tid if t != pid]
    print("send\t" + (line(by_tid[busiest(others)]) if others else "no samples"))
    print("recv\t" + line(by_tid.get(pid, collections.Counter())))
else:
    print(line(by_tid[busiest(list(by_tid))]))' $((HZ_SAMPLE * (SECS - 3))) "$1" "${2:-busiest}"
}

printf '%-12s | %9s | %s\n' sender "MB/s" "thread: busy; shares of its samples in the two copies; busiest functions"

# iperf3: the client is the sender.
port=$(free_port)
srv=$(start_iperf3_server "$port")
timeout $((SECS + 30)) iperf3 -c 127.0.0.1 -p "$port" -l 1M -t "$SECS" -J >"$tmp/iperf3.json" 2>/dev/null &
client=$!
sleep 0.5
prof=$(profile "$(pgrep -n -f "iperf3 -c 127.0.0.1 -p $port")")
wait "$client" || true
stop_iperf3_server "$srv"
srv=""
rate=$(iperf3_received "$tmp/iperf3.json" | cut -d' ' -f1)
printf '%-12s | %9s | %s\n' iperf3 "$rate" "$prof"

# pair_row NAME ARGS... — loopback_pair with ARGS; prints its sender's row and its receiver's.
pair_row() {
    local name=$1 out p
    shift
    timeout $((SECS + 60)) "$pair" "$@" --buffers 8 --secs "$SECS" >"$tmp/pair.out" &
    p=$!
    sleep 0.3
    # (the pair itself, not the timeout(1) around it)
    out=$(profile "$(pgrep -n -P "$p")" pair)
    wait "$p"
    printf '%-12s | %9s | send: %s\n' "$name" "$(cat "$tmp/pair.out")" "$(sed -n 's/^send\t//p' <<<"$out")"
    printf '%-12s | %9s | recv: %s\n' "" "" "$(sed -n 's/^recv\t//p' <<<"$out")"
}
pair_row "pair hot" --hot
pair_row "pair mapped" --file "$tmp/l0.img" --mapped
pair_row "pair splice" --file "$tmp/l0.img" --splice

# blockwire: the LUN file served to blockwire bench.
bw_port=$(free_port)
blockwire_file_config "$tmp/target.toml" "$IQN" "$tmp/l0.img" "${SIZE_MIB}M"
bw_pid=$(start_blockwire "$bw_port" "$tmp" "$tmp/target.toml")
timeout $((SECS + 60)) "$cli" bench -p "127.0.0.1:$bw_port" -T "$IQN" -l 0 --pattern seq --op read \
    --bs 1M --qd 8 --time "${SECS}s" >"$tmp/bench.out" 2>&1 &
client=$!
prof=$(profile "$bw_pid")
wait "$client" || { echo "blockwire bench failed:" >&2; cat "$tmp/bench.out" >&2; exit 1; }
rate=$(sed -n 's/.*MB\/s=\([0-9.]*\).*/\1/p' "$tmp/bench.out" | head -n 1)
printf '%-12s | %9s | %s\n' blockwire "${rate:-?}" "$prof"
