# shellcheck shell=bash
# interop/lib/peers.sh — helpers for end-to-end tests against third-party iSCSI peers.
#
# Source it:   . "$(dirname "$0")/lib/peers.sh"
#
# Functions (all waits are bounded with `timeout`):
#   free_port                          print a free TCP port on 127.0.0.1 in 20000-32000
#                                      (tgtd's -C control port must be <= 32767, and the
#                                      kernel's ephemeral range starts at 32768)
#   start_tgtd PORT DIR                start `tgtd -f` with control port = iSCSI port = PORT,
#                                      log to DIR/tgtd-PORT.log, wait until both the control
#                                      socket and the iSCSI portal answer, print the PID
#   tgtd_new_target PORT TID IQN       create a target and bind it to ALL initiators
#   tgtd_add_lun PORT TID LUN FILE [SIZE_MIB] [extra tgtadm args...]
#                                      add a LUN backed by FILE (created with SIZE_MIB if
#                                      missing; default 64)
#   tgtd_chap PORT in|out USER PASS [TID]
#                                      create the CHAP account (if new) and bind it:
#                                      with TID to that target's logins ("session"), without
#                                      TID to discovery sessions; `out` = the target's own
#                                      (mutual CHAP) account, `--outgoing` in tgtadm terms
#   stop_pid PID                       SIGTERM, wait up to 2 s, then SIGKILL
#   start_qemu_nbd SOCKET URL LOG      export the iSCSI LUN at URL (iscsi://HOST:PORT/IQN/LUN)
#                                      on the Unix socket SOCKET through QEMU's iscsi driver
#                                      (qemu-nbd, raw, cache=none), log to LOG, wait (<= 10 s)
#                                      for the socket, print the PID
#   stop_qemu_nbd PID...               SIGTERM each, wait up to 5 s each (qemu-nbd logs out of
#                                      its target on the way out), then SIGKILL
#   stop_tgtd PORT PID                 stop a tgtd from start_tgtd: SIGKILL (tgtd catches and
#                                      ignores SIGTERM/SIGINT, and `tgtadm --op delete --mode
#                                      system` refuses while targets exist), then remove its
#                                      control socket /var/run/tgtd/socket.PORT{,.lock}
#   cpu_ticks PID                      user + system clock ticks the process (all its
#                                      threads) has used so far (/proc/PID/stat; getconf
#                                      CLK_TCK per second), for a benchmark's CPU per I/O
#   minor_faults PID                   minor page faults the process (all its threads) has
#                                      taken so far (/proc/PID/stat field 10): first touches
#                                      of new anonymous pages, for a benchmark's faults per I/O
#   iscsiadm_discover HOST:PORT [--chap USER PASS] [--mutual USER_IN PASS_IN] [--isns]
#                                      open-iscsi SendTargets discovery without the kernel
#                                      (see /work/shared/INTEROP.md); prints iscsiadm's
#                                      stdout, returns its exit code (24 = auth failure,
#                                      19 = bad mutual-CHAP answer from the target);
#                                      --isns: ask the iSNS server at HOST:PORT instead
#                                      (-m discovery -t isns; 21 = no target found)
#
# Everything a caller starts it must stop by PID, e.g.
#   pid=$(start_tgtd "$port" "$tmp"); trap 'stop_tgtd "$port" "$pid"' EXIT

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
minor_faults() { awk '{ print $10 }' "/proc/$1/stat"; }

# Print a free loopback TCP port. Not port 0 / the kernel's choice: those come from the
# ephemeral range (>= 32768 here) and tgtd rejects a control port above 32767. A port whose
# tgtd control socket exists is skipped too.
free_port() {
    python3 -c '
import os, random, socket
for _ in range(1000):
    p = random.randint(20000, 32000)
    if os.path.exists("/var/run/tgtd/socket.%d" % p):
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    print(p)
    break
else:
    raise SystemExit("free_port: no free port found")
'
}

# True when something accepts TCP connections on 127.0.0.1:PORT.
_port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# start_tgtd PORT DIR — prints the PID of the tgtd process.
start_tgtd() {
    local port=$1 dir=$2 pid
    [ "$port" != 3260 ] || { echo "start_tgtd: refusing port 3260" >&2; return 1; }
    mkdir -p "$dir"
    # Output goes to a file so that `pid=$(start_tgtd ...)` does not wait for tgtd's stdout.
    tgtd -f -C "$port" --iscsi "portal=127.0.0.1:$port" \
        >"$dir/tgtd-$port.log" 2>&1 </dev/null &
    pid=$!
    # Wait (bounded) until the management socket and the portal both answer.
    if ! timeout 10 bash -c '
            until tgtadm -C "$1" --op show --mode sys >/dev/null 2>&1 \
                  && (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
                kill -0 "$2" 2>/dev/null || exit 1
                sleep 0.1
            done' _ "$port" "$pid"; then
        echo "start_tgtd: tgtd on port $port did not come up (log: $dir/tgtd-$port.log)" >&2
        stop_tgtd "$port" "$pid"
        return 1
    fi
    echo "$pid"
}

# tgtd_new_target PORT TID IQN — new target, ACL open to every initiator.
tgtd_new_target() {
    local port=$1 tid=$2 iqn=$3
    tgtadm -C "$port" --lld iscsi --op new --mode target --tid "$tid" -T "$iqn" &&
        tgtadm -C "$port" --lld iscsi --op bind --mode target --tid "$tid" -I ALL
}

# tgtd_add_lun PORT TID LUN FILE [SIZE_MIB] [extra tgtadm args...]
tgtd_add_lun() {
    local port=$1 tid=$2 lun=$3 file=$4 size=${5:-64}
    shift 5 2>/dev/null || shift $#
    if [ ! -e "$file" ]; then
        truncate -s "${size}M" "$file" || return 1
    fi
    tgtadm -C "$port" --lld iscsi --op new --mode logicalunit --tid "$tid" --lun "$lun" \
        -b "$file" "$@"
}

# tgtd_chap PORT in|out USER PASS [TID]
tgtd_chap() {
    local port=$1 dir=$2 user=$3 pass=$4 tid=${5:-}
    local -a bind=(tgtadm -C "$port" --lld iscsi --op bind --mode account --user "$user")
    # Create the account once; the same account may be bound to several places.
    if ! tgtadm -C "$port" --lld iscsi --op show --mode account 2>/dev/null |
            grep -qx "[[:space:]]*$user"; then
        tgtadm -C "$port" --lld iscsi --op new --mode account --user "$user" \
            --password "$pass" || return 1
    fi
    [ -n "$tid" ] && bind+=(--tid "$tid")
    case $dir in
        in) ;;
        out) bind+=(--outgoing) ;;
        *) echo "tgtd_chap: direction must be in or out" >&2; return 2 ;;
    esac
    "${bind[@]}"
}

# stop_pid PID — stop a process we started; quiet if it is already gone.
stop_pid() {
    local pid=$1
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || return 0
    if ! _wait_gone 2 "$pid"; then
        kill -9 "$pid" 2>/dev/null || true
        _wait_gone 5 "$pid" || true
    fi
    # Reap it if it is our child (no-op otherwise).
    wait "$pid" 2>/dev/null || true
}

# _wait_gone SECONDS PID — true once PID has exited (a zombie counts as exited: a child of a
# $(...) subshell is reparented, so the caller's `wait` cannot reap it).
_wait_gone() {
    timeout "$1" bash -c '
        while kill -0 "$1" 2>/dev/null && ! grep -q "^State:[[:space:]]*Z" "/proc/$1/status" 2>/dev/null
        do sleep 0.1; done' _ "$2"
}

# start_qemu_nbd SOCKET URL LOG — prints the PID. cache=none: no write-through emulation (no
# SYNCHRONIZE CACHE after each write); -t: the export outlives each NBD client; -e 4: up to four
# NBD clients at once.
start_qemu_nbd() {
    local sock=$1 url=$2 log=$3 pid
    qemu-nbd -f raw --cache=none -t -e 4 -k "$sock" "$url" >"$log" 2>&1 </dev/null &
    pid=$!
    if ! timeout 10 bash -c 'until [ -S "$1" ]; do kill -0 "$2" 2>/dev/null || exit 1; sleep 0.1; done' \
        _ "$sock" "$pid"; then
        sed 's/^/    /' "$log" >&2
        echo "start_qemu_nbd: qemu-nbd for $url did not create $sock" >&2
        kill -9 "$pid" 2>/dev/null || true
        return 1
    fi
    echo "$pid"
}

# stop_qemu_nbd PID... — stop qemu-nbds from start_qemu_nbd before the targets they use stop: a
# qemu-nbd whose target is gone keeps trying to reconnect instead of exiting.
stop_qemu_nbd() {
    local pid
    for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
    for pid in "$@"; do
        _wait_gone 5 "$pid" || kill -9 "$pid" 2>/dev/null || true
    done
}

# start_iperf3_server PORT — a one-off iperf3 server on PORT (it serves one client, then exits);
# prints its PID once it listens. Waits by looking at the listening sockets, not by connecting:
# a one-off server would take the probe for its client.
start_iperf3_server() {
    local port=$1 pid
    iperf3 -s -1 -p "$port" >/dev/null 2>&1 </dev/null &
    pid=$!
    for _ in $(seq 50); do ss -Hltn "sport = :$port" | grep -q . && break; sleep 0.1; done
    echo "$pid"
}

# stop_iperf3_server PID — after its client ran: at most 5 s for it to exit, then SIGKILL.
stop_iperf3_server() {
    _wait_gone 5 "$1" || kill -9 "$1" 2>/dev/null || true
}

# iperf3_received FILE — "MB/s seconds" received over the iperf3 JSON reports (-J) in FILE, one
# after another (bytes and seconds summed over them; "0 0" if there are none).
iperf3_received() {
    python3 -c 'import json, sys
text, dec, i, b, s = open(sys.argv[1]).read(), json.JSONDecoder(), 0, 0, 0.0
while True:
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text):
        break
    try:
        doc, i = dec.raw_decode(text, i)
    except ValueError:
        break
    r = doc.get("end", {}).get("sum_received", {})
    b, s = b + r.get("bytes", 0), s + r.get("seconds", 0.0)
print(f"{b / s / 1e6:.1f}" if b and s else 0, s)' "$1"
}

# stop_tgtd PORT PID
stop_tgtd() {
    local port=$1 pid=$2
    if [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; then
        _wait_gone 5 "$pid" || true
        wait "$pid" 2>/dev/null || true
    fi
    if [ -n "$port" ]; then
        rm -f "/var/run/tgtd/socket.$port" "/var/run/tgtd/socket.$port.lock"
    fi
    return 0
}

# iscsiadm_discover HOST:PORT [--chap USER PASS] [--mutual USER_IN PASS_IN] [--isns]
#
# Runs inside a private mount namespace (unshare -m) so neither the host's sysfs view nor
# its open-iscsi node database is touched:
#   - tmpfs on /sys/class with empty copies of the real class names plus a fake
#     iscsi_transport/tcp (handle=1, caps=0x39), which is all iscsiadm checks;
#   - scratch dirs bind-mounted over /etc/iscsi and /run/lock/iscsi;
#   - iface "tiface" (transport tcp), discoverydb new/update, then --discover.
# iscsiadm's stderr (iscsid/systemd noise) goes to stderr; its stdout to stdout.
iscsiadm_discover() {
    local portal=$1
    shift
    local user="" pass="" user_in="" pass_in="" isns=""
    while [ $# -gt 0 ]; do
        case $1 in
            --chap) user=$2 pass=$3; shift 3 ;;
            --mutual) user_in=$2 pass_in=$3; shift 3 ;;
            --isns) isns=1; shift ;;
            *) echo "iscsiadm_discover: unknown argument $1" >&2; return 2 ;;
        esac
    done
    local scratch rc=0
    scratch=$(mktemp -d /tmp/iscsiadm-disc.XXXXXX) || return 2
    mkdir -p "$scratch/etc" "$scratch/lock"
    cp /etc/iscsi/iscsid.conf "$scratch/etc/iscsid.conf"
    echo "InitiatorName=iqn.2026-11.io.blockwire:iscsiadm-test" >"$scratch/etc/initiatorname.iscsi"
    # The inner script gets everything as positional arguments (no quoting games).
    timeout 60 unshare -m --propagation private bash -c '
        set -u
        portal=$1 scratch=$2 user=$3 pass=$4 user_in=$5 pass_in=$6 isns=$7
        classes=$(ls /sys/class)
        mount -t tmpfs tmpfs /sys/class || exit 2
        for c in $classes; do mkdir -p "/sys/class/$c"; done
        mkdir -p /sys/class/iscsi_transport/tcp
        echo 1 >/sys/class/iscsi_transport/tcp/handle
        echo 0x39 >/sys/class/iscsi_transport/tcp/caps
        mkdir -p /run/lock/iscsi
        mount --bind "$scratch/etc" /etc/iscsi || exit 2
        mount --bind "$scratch/lock" /run/lock/iscsi || exit 2
        ia() { iscsiadm "$@" >/dev/null || { echo "iscsiadm $* failed" >&2; exit 2; }; }
        ia -m iface -I tiface -o new
        ia -m iface -I tiface -o update -n iface.initiatorname \
            -v iqn.2026-11.io.blockwire:iscsiadm-test
        ia -m iface -I tiface -o update -n iface.transport_name -v tcp
        if [ -n "$isns" ]; then
            exec iscsiadm -m discovery -t isns -p "$portal" -I tiface
        fi
        ia -m discoverydb -t sendtargets -p "$portal" -I tiface -o new
        upd() { ia -m discoverydb -t sendtargets -p "$portal" -I tiface -o update -n "$1" -v "$2"; }
        if [ -n "$user" ]; then
            upd discovery.sendtargets.auth.authmethod CHAP
            upd discovery.sendtargets.auth.username "$user"
            upd discovery.sendtargets.auth.password "$pass"
        fi
        if [ -n "$user_in" ]; then
            upd discovery.sendtargets.auth.username_in "$user_in"
            upd discovery.sendtargets.auth.password_in "$pass_in"
        fi
        exec iscsiadm -m discoverydb -t sendtargets -p "$portal" -I tiface --discover
    ' _ "$portal" "$scratch" "$user" "$pass" "$user_in" "$pass_in" "$isns" || rc=$?
    rm -rf "$scratch"
    return "$rc"
}
