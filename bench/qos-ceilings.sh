#!/usr/bin/env bash
# bench/qos-ceilings.sh — what a LUN's QoS ceilings (iops_limit, bandwidth_limit; docs/control.md)
# do to the traffic they hold, in one invocation against one release blockwire-target with two
# 1 GiB RAM LUNs. For each case `blockwire bench` runs SECS (default 5) seconds on LUN 0 without a
# ceiling, then with one set live by `ctl lun.limit`; it prints the rate reached, the ceiling, their
# ratio (1.00 = held exactly; the 50 ms burst lets a little more through), the rate without the
# ceiling (the ceiling must be below it to mean anything) and the p99 latency both ways. Cases:
# 4 KiB random READs and WRITEs at QD16 under 500 IOPS, 1 MiB sequential READs and WRITEs at QD8
# under 100 MiB/s, two sessions at QD8 each sharing one 1000 IOPS ceiling. Then a neighbour: LUN 1's
# 4 KiB QD1 READs while LUN 0 takes 1 MiB QD16 READs, unthrottled and under 100 MiB/s (what a
# ceiling on a busy LUN gives the others on this machine, whatever it is). Last, a shared LUN: host
# B's 4 KiB QD1 READs beside host A's QD32 ones on LUN 0, under a 1000 IOPS ceiling of the LUN's
# alone and then with each host also held to 500 (initiator_iops_limit); B starts 0.5 s after A,
# so the LUN's own rate is both hosts' commands over the SECS + 0.5 s either ran. Results:
# bench/qos-ceilings-results.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib.sh"
SECS=${SECS:-5}
command -v python3 >/dev/null || { echo "FAIL: python3 is not installed" >&2; exit 1; }
tmp=$(mktemp -d)
pid=""
trap 'stop_daemon; rm -rf "$tmp"' EXIT

build_release
IQN=iqn.2026-12.io.blockwire:qos
port=$(free_port)
sock=$tmp/control.sock
cat >"$tmp/target.toml" <<EOT
[[portal_group]]
tag = 1
listen = ["127.0.0.1:$port"]

[[target]]
name = "$IQN"
[[target.lun]]
id = 0
backstore = "ram"
size = "1G"
[[target.lun]]
id = 1
backstore = "ram"
size = "1G"
EOT
wait_for_rustc
echo "machine: $(nproc) CPUs, $(uname -r), $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo); $(git -C "$repo" rev-parse --short HEAD); client and target on the same CPUs, nothing else running"
start_daemon "$tmp/target.log" --control "$sock"

ctl() { "$build/blockwire-target" ctl --control "$sock" "$@" >/dev/null; }
limit() { # lun iops bandwidth
    ctl lun.limit "{\"target\": \"$IQN\", \"lun\": $1, \"iops\": $2, \"bandwidth\": \"$3\"}"
}

limit_each() { # lun iops: each initiator's ceiling (0: none)
    ctl lun.limit "{\"target\": \"$IQN\", \"lun\": $1, \"initiator_iops\": $2}"
}

# bench LUN OP PATTERN BS QD [INITIATOR]: one run; prints "IOPS MiB/s p99_usec".
bench() {
    local out
    out=$(timeout $((SECS + 60)) "$build/blockwire" bench -p "127.0.0.1:$port" -T "$IQN" -l "$1" \
        --op "$2" --pattern "$3" --bs "$4" --qd "$5" --time "${SECS}s" \
        --initiator-name "${6:-iqn.2026-12.io.blockwire:qos-bench}") ||
        { echo "blockwire bench failed ($*): $out" >&2; exit 1; }
    python3 - "$out" <<'PYEND'
import re, sys
out = sys.argv[1]
iops = float(re.search(r"IOPS=([0-9.]+)", out).group(1))
mibs = float(re.search(r"MiB/s=([0-9.]+)", out).group(1))
p99 = float(re.search(r"p99=([0-9.]+)", out).group(1))
print(f"{iops:.0f} {mibs:.1f} {p99:.0f}")
PYEND
}

# case NAME OP PATTERN BS QD IOPS BANDWIDTH UNIT: unthrottled, then under the ceiling (UNIT: iops
# or mibs, which rate the ceiling bounds; CEILING in that unit).
row() { # name op pattern bs qd iops bandwidth unit ceiling
    local free held
    limit 0 0 none
    read -r f_iops f_mibs f_p99 <<<"$(bench 0 "$2" "$3" "$4" "$5")"
    limit 0 "$6" "$7"
    read -r h_iops h_mibs h_p99 <<<"$(bench 0 "$2" "$3" "$4" "$5")"
    limit 0 0 none
    if [ "$8" = iops ]; then free=$f_iops held=$h_iops; else free=$f_mibs held=$h_mibs; fi
    python3 -c 'import sys
n, unit, ceiling, free, held, fp, hp = sys.argv[1:8]
ceiling, free, held = float(ceiling), float(free), float(held)
print(f"{n:<34} {held:>9.1f} {unit:<5} ceiling {ceiling:>6.0f}  ratio {held / ceiling:5.2f}   without: {free:>8.1f} ({free / ceiling:5.1f}x the ceiling)   p99 {hp:>6} us vs {fp:>5} us")' \
        "$1" "$8" "$9" "$free" "$held" "$f_p99" "$h_p99"
}

echo
echo "case                               reached under the ceiling                     rate without it                  p99 latency with vs without"
row "4 KiB random READ, QD16" read rand 4k 16 500 none iops 500
row "4 KiB random WRITE, QD16" write rand 4k 16 500 none iops 500
row "1 MiB sequential READ, QD8" read seq 1M 8 0 100M mibs 100
row "1 MiB sequential WRITE, QD8" write seq 1M 8 0 100M mibs 100

# Two sessions (two processes) share one ceiling.
two() {
    bench 0 read rand 4k 8 >"$tmp/a" &
    local a=$!
    bench 0 read rand 4k 8 >"$tmp/b"
    wait "$a"
    python3 -c 'import sys; a=open(sys.argv[1]).read().split(); b=open(sys.argv[2]).read().split(); print(float(a[0]) + float(b[0]), a[0], b[0])' "$tmp/a" "$tmp/b"
}
limit 0 0 none
read -r free fa fb <<<"$(two)"
limit 0 1000 none
read -r held ha hb <<<"$(two)"
limit 0 0 none
python3 -c 'import sys
free, held, ha, hb = map(float, sys.argv[1:5])
name = "2 sessions x 4 KiB READ QD8"
print(f"{name:<34} {held:>9.1f} iops  ceiling   1000  ratio {held / 1000:5.2f}   without: {free:>8.1f} ({free / 1000:5.1f}x the ceiling)   shares {ha:.0f} + {hb:.0f}")' \
    "$free" "$held" "$ha" "$hb"

# The neighbour: LUN 1 at QD1 while LUN 0 streams.
neighbour() { # bandwidth of LUN 0's ceiling
    limit 0 0 "$1"
    bench 0 read seq 1M 16 >"$tmp/noisy" &
    local n=$!
    sleep 0.5
    read -r v_iops v_mibs v_p99 <<<"$(bench 1 read rand 4k 1)"
    wait "$n"
    read -r n_iops n_mibs n_p99 <<<"$(cat "$tmp/noisy")"
    echo "$v_iops $v_p99 $n_mibs"
}
read -r alone_iops _ alone_p99 <<<"$(bench 1 read rand 4k 1)"
read -r free_iops free_p99 free_noisy <<<"$(neighbour none)"
read -r held_iops held_p99 held_noisy <<<"$(neighbour 100M)"
limit 0 0 none
echo
python3 -c 'import sys
ai, ap, fi, fp, fn, hi, hp, hn = map(float, sys.argv[1:9])
print(f"neighbour: LUN 1 4 KiB random READ QD1 alone {ai:.0f} IOPS (p99 {ap:.0f} us); beside LUN 0 1 MiB READ QD16 unthrottled ({fn:.0f} MiB/s): {fi:.0f} IOPS, p99 {fp:.0f} us; beside LUN 0 under 100 MiB/s ({hn:.0f} MiB/s): {hi:.0f} IOPS, p99 {hp:.0f} us")
print(f"neighbour ratios: IOPS throttled/unthrottled {hi / fi:.2f}, p99 throttled/unthrottled {hp / fp:.2f}, IOPS unthrottled/alone {fi / ai:.2f}")' \
    "$alone_iops" "$alone_p99" "$free_iops" "$free_p99" "$free_noisy" "$held_iops" "$held_p99" "$held_noisy"

# A shared LUN: host B at QD1 beside host A at QD32, under the LUN's ceiling alone, then with each
# host held to a share of its own. B starts B_LATE seconds after A.
B_LATE=0.5
shared() {
    bench 0 read rand 4k 32 iqn.2026-12.io.blockwire:host-a >"$tmp/busy" &
    local a=$!
    sleep "$B_LATE"
    read -r b_iops _ b_p99 <<<"$(bench 0 read rand 4k 1 iqn.2026-12.io.blockwire:host-b)"
    wait "$a"
    read -r a_iops _ _ <<<"$(cat "$tmp/busy")"
    echo "$a_iops $b_iops $b_p99"
}
limit 0 1000 none
read -r lun_a lun_b lun_p99 <<<"$(shared)"
limit_each 0 500
read -r each_a each_b each_p99 <<<"$(shared)"
limit_each 0 0
limit 0 0 none
echo
python3 -c 'import sys
la, lb, lp, ea, eb, ep = map(float, sys.argv[1:7])
print(f"shared LUN under 1000 IOPS: host A QD32 {la:.0f} IOPS, host B QD1 {lb:.0f} IOPS (p99 {lp:.0f} us); with each host held to 500 IOPS: A {ea:.0f}, B {eb:.0f} IOPS (p99 {ep:.0f} us)")
secs, late = float(sys.argv[7]), float(sys.argv[8])
# A runs SECS seconds from 0, B SECS seconds from B_LATE: each rate is over its own SECS, but the
# LUN served both over about SECS + B_LATE, so the LUN'"'"'s rate is their commands over that span.
span = secs + late
lun = (la + lb) * secs / span
print(f"shared LUN ratios: host B IOPS each-host/LUN-only {eb / lb:.2f}, host B p99 each-host/LUN-only {ep / lp:.3f}, host A+B each-host/ceiling {(ea + eb) / 1000:.2f}; under the LUN'"'"'s ceiling alone, A and B over the {span:.1f} s either ran: {lun:.0f} IOPS, ratio {lun / 1000:.2f}")' \
    "$lun_a" "$lun_b" "$lun_p99" "$each_a" "$each_b" "$each_p99" "$SECS" "$B_LATE"
