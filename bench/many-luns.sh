#!/usr/bin/env bash
# bench/many-luns.sh — what a target with many LUNs costs its administrator: LUNS (default 1000)
# file LUNs are added one at a time to one running target, blockwire-target's through its control
# socket and tgtd's through tgtadm, in one invocation. Prints the time per added LUN at every STEP
# (default 100) LUNs, how the last step compares with the first (a cost that grows with the LUNs
# already there shows as a ratio well above 1), blockwire against tgtd at each step, the time one
# `blockwire-target ctl lun.add` (a process per call, as tgtadm is) takes at the end, a login's
# REPORT LUNS through iscsi-ls (every LUN listed), and for blockwire `lun.list`, `config.save`,
# a restart from the saved file, a SIGHUP reload with all the LUNs, and one that adds them all at
# once to a daemon serving LUN 0 alone, as does one lun.add with their list, and each daemon's
# memory. Then the same number of targets
# of one LUN each (one target per volume): time per target added, and SendTargets listing them.
# Each LUN is its own sparse 1 MiB file in a scratch directory. BLOCKWIRE_BIN: another
# blockwire-target binary (a build from before a change). Results: bench/many-luns-results.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib.sh"
. "$repo/interop/lib/peers.sh"
LUNS=${LUNS:-1000} STEP=${STEP:-100}
[ "$LUNS" -ge "$((2 * STEP))" ] && [ "$LUNS" -le 16384 ] ||
    { echo "LUNS must be at least 2 x STEP ($((2 * STEP))) and at most 16384 (flat LUN addressing)" >&2; exit 2; }
for tool in tgtd tgtadm iscsi-ls python3; do
    command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (apt-get install tgt libiscsi-bin python3)" >&2; exit 1; }
done
tmp=$(mktemp -d)
pid="" tgt_pid="" tgt_port=""
trap 'stop_daemon; [ -z "$tgt_pid" ] || stop_tgtd "$tgt_port" "$tgt_pid"; rm -rf "$tmp"' EXIT

build_release
bin=${BLOCKWIRE_BIN:-$build/blockwire-target}
IQN=iqn.2026-11.io.blockwire:many-luns
TGT_IQN=iqn.2026-11.io.tgtd:many-luns
mkdir -p "$tmp/bw" "$tmp/tgt"
for ((l = 0; l < LUNS; l++)); do truncate -s 1M "$tmp/bw/l$l.img" "$tmp/tgt/l$l.img"; done
port=$(free_port)
cat >"$tmp/target.toml" <<EOT
[[portal_group]]
tag = 1
listen = ["127.0.0.1:$port"]

[[target]]
name = "$IQN"
[[target.lun]]
id = 0
backstore = "file"
path = "$tmp/bw/l0.img"
size = "1M"
EOT
cp "$tmp/target.toml" "$tmp/one-lun.toml"
wait_for_rustc
echo "machine: $(nproc) CPUs, $(uname -r), $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo); $(git -C "$repo" rev-parse --short HEAD)${BLOCKWIRE_BIN:+, BLOCKWIRE_BIN=$BLOCKWIRE_BIN}"
echo "$LUNS file LUNs of 1 MiB (sparse) on one target, added one by one after LUN 0"
sock=$tmp/control.sock
start_daemon "$tmp/target.log" --control "$sock"

# Over one control-socket connection, adds LUNs 1..LUNS-1 to $IQN (luns) or targets
# $IQN-1..$IQN-(LUNS-1) of one LUN each (targets), and prints, per STEP LUNs or targets, the
# milliseconds per lun.add or target.add; then the milliseconds of lun.list and config.save.
add_over_socket() { # luns|targets files-dir
    python3 - "$sock" "$IQN" "$2" "$LUNS" "$STEP" "$1" <<'EOF'
import json, socket, sys, time
sock, iqn, files, luns, step, mode = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
s = socket.socket(socket.AF_UNIX)
s.connect(sock)
f = s.makefile("rw")
def call(method, params):
    f.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}) + "\n")
    f.flush()
    r = json.loads(f.readline())
    if "error" in r:
        sys.exit(f"{method}: {r['error']}")
    return r["result"]
t = time.monotonic()
if mode == "list":
    t = time.monotonic()
    call("lun.add", {"target": iqn, "lun": [{"id": lun, "backstore": "file", "path": f"{files}/l{lun}.img",
                                             "size": "1M"} for lun in range(1, luns)]})
    print("list-add", luns - 1, 1000 * (time.monotonic() - t))
    sys.exit(0)
for lun in range(1, luns):
    file = {"backstore": "file", "path": f"{files}/l{lun}.img", "size": "1M"}
    if mode == "luns":
        call("lun.add", {"target": iqn, "lun": {"id": lun, **file}})
    else:
        call("target.add", {"target": {"name": f"{iqn}-{lun}", "lun": [{"id": 0, **file}]}})
    if (lun + 1) % step == 0:
        now = time.monotonic()
        print("add", lun + 1, 1000 * (now - t) / (step - (lun + 1 == step)))
        t = now
t = time.monotonic()
n = sum(len(tg["luns"]) for tg in call("lun.list", {})["targets"])
print("list", n, 1000 * (time.monotonic() - t))
t = time.monotonic()
call("config.save", {})
print("save", 0, 1000 * (time.monotonic() - t))
EOF
}
add_over_socket luns "$tmp/bw" >"$tmp/bw.times"
ms() { awk -v k="$1" -v n="$2" '$1 == k && $2 == n {printf "%.2f", $3}' "$3"; }
t0=$(date +%s%N)
"$bin" ctl --control "$sock" lun.add "{\"target\":\"$IQN\",\"lun\":{\"id\":$LUNS,\"backstore\":\"file\",\"path\":\"$tmp/bw/extra.img\",\"size\":\"1M\"}}" >/dev/null
bw_cli_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
"$bin" ctl --control "$sock" lun.remove "{\"target\":\"$IQN\",\"lun\":$LUNS}" >/dev/null
bw_listed=$(timeout 60 iscsi-ls -s "iscsi://127.0.0.1:$port" | grep -c "Lun:" || true)
bw_rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status")
t0=$(date +%s%N)
kill -HUP "$pid"
timeout 120 bash -c 'until grep -q "configuration reloaded" "$1"; do sleep 0.01; done' _ "$tmp/target.log" ||
    { echo "FAIL: no reload within 120 s of SIGHUP" >&2; plain <"$tmp/target.log" | tail -5 >&2; exit 1; }
reload_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
stop_daemon
t0=$(date +%s%N)
start_daemon "$tmp/restart.log"
restart_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
restart_listed=$(timeout 60 iscsi-ls -s "iscsi://127.0.0.1:$port" | grep -c "Lun:" || true)
stop_daemon
# All the LUNs at once: a daemon started with LUN 0 alone reloads the saved file on SIGHUP.
cp "$tmp/target.toml" "$tmp/all-luns.toml"
head -n "$(grep -n '^\[\[target.lun\]\]' "$tmp/all-luns.toml" | sed -n 2p | cut -d: -f1)" "$tmp/all-luns.toml" |
    sed '$d' >"$tmp/target.toml"
start_daemon "$tmp/bulk.log"
[ "$(timeout 60 iscsi-ls -s "iscsi://127.0.0.1:$port" | grep -c "Lun:" || true)" -eq 1 ] ||
    { echo "FAIL: the one-LUN configuration did not start with one LUN" >&2; exit 1; }
cp "$tmp/all-luns.toml" "$tmp/target.toml"
t0=$(date +%s%N)
kill -HUP "$pid"
timeout 120 bash -c 'until grep -q "configuration reloaded" "$1"; do sleep 0.01; done' _ "$tmp/bulk.log" ||
    { echo "FAIL: no reload within 120 s of SIGHUP" >&2; plain <"$tmp/bulk.log" | tail -5 >&2; exit 1; }
bulk_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
bulk_listed=$(timeout 60 iscsi-ls -s "iscsi://127.0.0.1:$port" | grep -c "Lun:" || true)
stop_daemon
# And through the control socket: one lun.add with the list of them all.
cp "$tmp/one-lun.toml" "$tmp/target.toml"
start_daemon "$tmp/list.log" --control "$sock"
list_ms=$(add_over_socket list "$tmp/bw" | awk '{printf "%.0f", $3}')
list_listed=$(timeout 60 iscsi-ls -s "iscsi://127.0.0.1:$port" | grep -c "Lun:" || true)
stop_daemon

# tgtd: the same LUNs through tgtadm, one process per LUN as its administrators run it.
tgt_port=$(free_port)
tgt_pid=$(start_tgtd "$tgt_port" "$tmp")
tgtd_new_target "$tgt_port" 1 "$TGT_IQN"
t=$(date +%s%N)
for ((l = 1; l <= LUNS; l++)); do
    [ "$l" -lt "$LUNS" ] || t_last=$(date +%s%N)
    tgtd_add_lun "$tgt_port" 1 "$l" "$tmp/tgt/l$((l % LUNS)).img"
    if [ "$l" -lt "$LUNS" ] && [ $(((l + 1) % STEP)) -eq 0 ]; then
        now=$(date +%s%N)
        awk -v n=$((l + 1)) -v d=$((now - t)) -v k=$((STEP - (l + 1 == STEP))) 'BEGIN {print "add", n, d / 1e6 / k}'
        t=$now
    fi
done >"$tmp/tgt.times"
tgt_last_ms=$(( ($(date +%s%N) - t_last) / 1000000 ))
# tgtd's LUN 0 is its controller; LUN LUNS reuses file 0, so tgtd lists LUNS + 1.
tgt_listed=$(timeout 60 iscsi-ls -s "iscsi://127.0.0.1:$tgt_port" | grep -c "Lun:" || true)
tgt_rss=$(awk '/VmRSS/ {print $2}' "/proc/$tgt_pid/status")
stop_tgtd "$tgt_port" "$tgt_pid"
tgt_pid=""

# Many targets of one LUN each (one target per volume): blockwire's target.add, and tgtd's three
# tgtadm calls (new target, bind its access list, new LUN) per target.
cp "$tmp/one-lun.toml" "$tmp/target.toml"
start_daemon "$tmp/targets.log" --control "$sock"
add_over_socket targets "$tmp/bw" >"$tmp/bwt.times"
bwt_listed=$(timeout 60 iscsi-ls "iscsi://127.0.0.1:$port" | grep -c "^Target:" || true)
stop_daemon
tgt_port=$(free_port)
tgt_pid=$(start_tgtd "$tgt_port" "$tmp")
tgtd_new_target "$tgt_port" 1 "$TGT_IQN"
t=$(date +%s%N)
for ((l = 1; l < LUNS; l++)); do
    tgtd_new_target "$tgt_port" $((l + 1)) "$TGT_IQN-$l"
    tgtd_add_lun "$tgt_port" $((l + 1)) 1 "$tmp/tgt/l$l.img"
    if [ $(((l + 1) % STEP)) -eq 0 ]; then
        now=$(date +%s%N)
        awk -v n=$((l + 1)) -v d=$((now - t)) -v k=$((STEP - (l + 1 == STEP))) 'BEGIN {print "add", n, d / 1e6 / k}'
        t=$now
    fi
done >"$tmp/tgtt.times"
tgtt_listed=$(timeout 60 iscsi-ls "iscsi://127.0.0.1:$tgt_port" | grep -c "^Target:" || true)
stop_tgtd "$tgt_port" "$tgt_pid"
tgt_pid=""

# The time per add at each step, blockwire's against tgtd's.
per_step() { # heading blockwire-times tgtd-times
    printf '%-8s %16s %16s %14s\n' "$1" "blockwire ms/add" "tgtd ms/add" "blockwire/tgtd"
    for ((n = STEP; n <= LUNS; n += STEP)); do
        b=$(ms add "$n" "$2") g=$(ms add "$n" "$3")
        printf '%-8s %16s %16s %14s\n' "$n" "$b" "$g" "$(awk -v b="$b" -v g="$g" 'BEGIN {printf "%.2fx", b / g}')"
    done
}
growth() { awk -v a="$(ms add "$STEP" "$1")" -v z="$(ms add "$LUNS" "$1")" 'BEGIN {printf "%.2fx", z / a}'; }
echo
per_step LUNs "$tmp/bw.times" "$tmp/tgt.times"
echo "last step against the first (1.00x: a LUN costs the same however many are there):" \
    "blockwire $(growth "$tmp/bw.times"), tgtd $(growth "$tmp/tgt.times")"
echo
per_step targets "$tmp/bwt.times" "$tmp/tgtt.times"
echo "last step against the first: blockwire $(growth "$tmp/bwt.times"), tgtd $(growth "$tmp/tgtt.times");" \
    "SendTargets through iscsi-ls lists blockwire's $bwt_listed and tgtd's $tgtt_listed of $LUNS targets"
echo
echo "one add at $LUNS LUNs as a process per call: blockwire-target ctl lun.add $bw_cli_ms ms, tgtadm $tgt_last_ms ms"
echo "blockwire, all $((LUNS - 1)) LUNs added at once to a daemon with LUN 0 alone: SIGHUP reload of the saved file $bulk_ms ms, one lun.add with their list $list_ms ms"
echo "REPORT LUNS through iscsi-ls: blockwire $bw_listed of $LUNS LUNs, after a restart $restart_listed, after the bulk reload $bulk_listed, after the list $list_listed; tgtd $tgt_listed (its LUN 0 is a controller, so $((LUNS + 1)) expected)"
echo "blockwire with $LUNS LUNs: lun.list $(ms list "$LUNS" "$tmp/bw.times") ms, config.save $(ms save 0 "$tmp/bw.times") ms," \
    "SIGHUP reload $reload_ms ms, restart from the saved file to listening $restart_ms ms"
echo "memory (VmRSS): blockwire $((bw_rss / 1024)) MiB, tgtd $((tgt_rss / 1024)) MiB"
[ "$bw_listed" -eq "$LUNS" ] && [ "$restart_listed" -eq "$LUNS" ] && [ "$bulk_listed" -eq "$LUNS" ] &&
    [ "$list_listed" -eq "$LUNS" ] &&
    [ "$bwt_listed" -eq "$LUNS" ] || { echo "FAIL: blockwire did not list every LUN and target" >&2; exit 1; }
