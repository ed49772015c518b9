# shellcheck shell=bash
# interop/kernel/lib.sh — helpers for the scripts that run INSIDE the kernel lab's guest
# (../shared/kernel-lab/run.sh boots Debian's 6.12 kernel with this machine's root read-only).
#
# Source it from a guest script:  . "$(dirname "$0")/lib.sh"
#
# Every check prints one line, "PASS name: detail" or "FAIL name: detail"; `finish` prints the
# totals and returns 1 when any check failed, so the host driver (interop/test-kernel-lab.sh)
# sees the guest's exit status. Nothing here ever prints SKIP: a check that cannot run fails.

set -uo pipefail
export HOME=/tmp
KL_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KL_BIN=${BLOCKWIRE_BUILD:-$KL_REPO/build}/release
KL_OUT=${KL_OUT:?KL_OUT: the host-shared results directory}
KL_WORK=/tmp/kl-work
mkdir -p "$KL_WORK" "$KL_OUT"
_kl_pass=0 _kl_fail=0

# ---- the kernel's console on the host -----------------------------------------------------------
# A guest whose kernel panics is gone at once (virtme-ng exits 255): `dmesg -w`, a process, never
# writes the panic into KL_OUT. netconsole sends console messages from the kernel itself, panic
# included, as UDP over QEMU's user-mode NIC (run.sh --net) to the host's listener on
# KL_CONSOLE_PORT (interop/kernel/console_listener.py). That NIC carries nothing else: no
# address, IPv6 off, an unreachable default route: no way out of the guest; netconsole names
# its own source address. Console level 5: warnings and worse (oops, lockups, hung tasks,
# panics) as they happen.

# The user-mode NIC has QEMU's default MAC; the private links of run.sh --link have their own.
_kl_user_nic() {
    local d
    for d in /sys/class/net/*; do
        [ "$(cat "$d/address" 2>/dev/null)" = 52:54:00:12:34:56 ] && echo "${d##*/}"
    done
    return 0
}
_kl_netconsole() {
    [ -n "${KL_CONSOLE_PORT:-}" ] || return 0
    local dev
    dev=$(_kl_user_nic)
    if [ -z "$dev" ]; then
        printf '[%s] kernel console: no user-mode NIC, not sent to the host\n' "$(date +%T)"
        return 0
    fi
    sysctl -qw "net.ipv6.conf.$dev.disable_ipv6=1"
    # Should a DHCP client configure the NIC later, its default route finds this one in place.
    ip route add unreachable default 2>/dev/null
    ip link set "$dev" up
    dmesg -n 5
    modprobe netconsole "netconsole=6665@10.0.2.15/$dev,$KL_CONSOLE_PORT@10.0.2.2/" ||
        printf '[%s] kernel console: netconsole did not load, not sent to the host\n' "$(date +%T)"
}
_kl_netconsole

# Every line the script prints is also a heartbeat for the stall watchdog below.
_kl_beat() { printf '%s\n' "$EPOCHSECONDS" 2>/dev/null >/run/kl-beat; }
log() { _kl_beat; printf '[%s] %s\n' "$(date +%T)" "$*"; }
pass() { _kl_beat; _kl_pass=$((_kl_pass + 1)); printf 'PASS %s\n' "$*"; }
fail() { _kl_beat; _kl_fail=$((_kl_fail + 1)); printf 'FAIL %s\n' "$*"; }
# check NAME CMD...: run CMD, PASS or FAIL by its exit status.
check() {
    local name=$1
    shift
    if "$@"; then pass "$name"; else fail "$name (exit $?)"; fi
}
finish() {
    printf '==== %s: %d passed, %d failed\n' "${1:-guest}" "$_kl_pass" "$_kl_fail"
    [ "$_kl_fail" = 0 ]
}

# ---- stall watchdog ---------------------------------------------------------------------------
# A guest script that stops printing leaves nothing behind when the host's timeout kills the
# guest. So when no log/PASS/FAIL line has come for KL_QUIET seconds (default 240), this prints
# to stderr (a virtio serial port, not the 9p share) every process's state and wait channel,
# and the kernel stacks of the script's own descendants and of every task in uninterruptible
# or killable sleep (which the kernel's hung-task detector skips). It uses bash builtins only,
# so it still reports when the shared root file system no longer answers. It only reports: a
# quiet phase that is expected (a long wait for the peer guest) ends with the next line.
_kl_proc_line() { # PID: sets _kl_line "pid ppid state wchan args", _kl_ppid, _kl_state
    local p=$1 stat wchan=- args=() f
    read -r stat 2>/dev/null <"/proc/$p/stat" || return 1
    f=(${stat##*) }) # after the command name: state, ppid, ...
    _kl_state=${f[0]} _kl_ppid=${f[1]}
    read -r wchan 2>/dev/null <"/proc/$p/wchan"
    mapfile -d "" args 2>/dev/null <"/proc/$p/cmdline"
    [ ${#args[@]} -gt 0 ] || return 1 # a kernel thread
    _kl_line="$p $_kl_ppid $_kl_state ${wchan:--} ${args[*]:0:12}"
}
_kl_stall_report() { # MAIN_PID QUIET_SECS
    local main=$1 p d frame
    local -A parent=() state=()
    printf 'watch| no log, PASS or FAIL line for %ss; processes (pid ppid state wchan args):\n' "$2"
    for d in /proc/[0-9]*; do
        p=${d#/proc/}
        [ "$p" = "$BASHPID" ] && continue
        _kl_proc_line "$p" || continue
        printf 'watch|   %s\n' "$_kl_line"
        parent[$p]=$_kl_ppid state[$p]=$_kl_state
    done
    for p in "${!parent[@]}"; do
        d=$p
        while [ -n "${parent[$d]:-}" ] && [ "$d" != "$main" ]; do d=${parent[$d]}; done
        [ "$d" = "$main" ] || [ "${state[$p]}" = D ] || continue
        printf 'watch| kernel stack of %s (%s):\n' "$p" "${state[$p]}"
        while read -r _ frame; do printf 'watch|     %s\n' "$frame"; done 2>/dev/null <"/proc/$p/stack"
    done
}
_kl_watchdog() { # MAIN_PID
    local main=$1 quiet=${KL_QUIET:-240} beat reported=0 fd
    # A FIFO nobody writes is a sleep that needs no program from the shared root.
    mkfifo /run/kl-watch.fifo 2>/dev/null
    exec {fd}<>/run/kl-watch.fifo || return
    _kl_beat
    while [ "$reported" -lt 3 ]; do
        read -rt 5 -u "$fd" _
        kill -0 "$main" 2>/dev/null || return 0
        read -r beat 2>/dev/null </run/kl-beat || continue
        if [ $((EPOCHSECONDS - beat)) -ge "$quiet" ]; then
            _kl_stall_report "$main" "$((EPOCHSECONDS - beat))" >&2
            reported=$((reported + 1))
            _kl_beat # the next report comes after another quiet period
        fi
    done
}
_kl_watchdog $$ </dev/null &

# lab_up: loopback, the initiator's kernel modules and iscsid (foreground daemon, backgrounded).
lab_up() {
    ip link set lo up
    # The kernel's messages, as they come, in the results directory: if the guest dies
    # (virtme-ng then exits 255 with the suite cut short), whatever the kernel said before
    # it is still on the host.
    dmesg -w >"$KL_OUT/dmesg.log" 2>&1 &
    modprobe -a iscsi_tcp sd_mod sg loop || return 1
    mkdir -p /run/lock/iscsi /etc/iscsi
    # The guest shares the host's /etc/iscsi read-only through an overlay: a clean node DB.
    rm -rf /etc/iscsi/nodes /etc/iscsi/send_targets /etc/iscsi/ifaces
    mkdir -p /etc/iscsi/ifaces
    echo "InitiatorName=${KL_INITIATOR:-iqn.2026-11.lab:kernel-guest}" >/etc/iscsi/initiatorname.iscsi
    # Kernel initiator defaults tuned for a TCG guest: quick failure detection, quick recovery.
    sed -i -e 's/^node.session.timeo.replacement_timeout = .*/node.session.timeo.replacement_timeout = 60/' \
        /etc/iscsi/iscsid.conf
    iscsid -f >"$KL_OUT/iscsid.log" 2>&1 &
    KL_ISCSID=$!
    timeout 10 bash -c 'until iscsiadm -m session >/dev/null 2>&1 || [ $? = 21 ]; do sleep 0.2; done'
}

# start_target NAME CONFIG [ARGS...]: start blockwire-target in the background, log to
# $KL_OUT/NAME.log, wait until every portal of CONFIG accepts. Sets KL_TPID.
start_target() {
    local name=$1 config=$2
    shift 2
    "$KL_BIN/blockwire-target" --config "$config" "$@" >>"$KL_OUT/$name.log" 2>&1 </dev/null &
    KL_TPID=$!
    local ports
    ports=$(grep -o '"127[.0-9]*:[0-9]*"' "$config" | tr -d '"' | sort -u)
    local p
    for p in $ports; do
        if ! timeout 30 bash -c 'until (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; do
                kill -0 "$2" 2>/dev/null || exit 1; sleep 0.1; done' _ "$p" "$KL_TPID"; then
            log "blockwire-target ($name) did not come up on $p:"
            tail -n 20 "$KL_OUT/$name.log"
            return 1
        fi
    done
}

# stop_target PID [SIGNAL]: signal (default TERM) and wait (<= 30 s, then KILL).
stop_target() {
    local pid=$1 sig=${2:-TERM}
    kill "-$sig" "$pid" 2>/dev/null || return 0
    timeout 30 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.1; done' _ "$pid" ||
        kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

# iscsiadm wrapper whose exit code is kept (iscsiadm's own failure codes are checked).
iadm() { iscsiadm "$@" 2>&1; }
# Whether the kernel log has a line matching grep's arguments. grep reads all of dmesg's output:
# with pipefail, `dmesg | grep -q` fails whenever grep stops reading before dmesg has written.
kernel_log_has() { dmesg | grep "$@" >/dev/null; }

# session_id IQN [IFACE]: the kernel's session number for IQN (through IFACE), or nothing.
session_id() {
    local s
    for s in /sys/class/iscsi_session/session*; do
        [ -e "$s/targetname" ] || continue
        [ "$(cat "$s/targetname")" = "$1" ] || continue
        if [ -n "${2:-}" ] && [ "$(cat "$s/ifacename" 2>/dev/null)" != "$2" ]; then continue; fi
        echo "${s##*session}"
        return 0
    done
}

# lun_dev SID LUN: wait (<= 60 s) for LUN of session SID to appear as a disk, print "sdX".
lun_dev() {
    local sid=$1 lun=$2 i d
    for i in $(seq 1 300); do
        for d in /sys/class/iscsi_session/session"$sid"/device/target*/*:*:*:"$lun"/block/*; do
            if [ -e "$d" ] && [ -b "/dev/${d##*/}" ]; then
                echo "${d##*/}"
                return 0
            fi
        done
        sleep 0.2
    done
    return 1
}

# fio_verify DEV SIZE [EXTRA...]: random writes 4 KiB-1 MiB at QD32, then crc32c verify of
# every block; verify_fatal stops at the first bad block. Output to $KL_OUT/fio-*.log.
fio_verify() {
    local dev=$1 size=$2
    shift 2
    fio --name=verify --filename="$dev" --direct=1 --ioengine=libaio --iodepth=32 \
        --rw=randwrite --bsrange=4k-1m --size="$size" --verify=crc32c --verify_fatal=1 \
        --do_verify=1 --verify_backlog=0 --group_reporting --output-format=normal "$@"
}

# fio_result LOG: the line summary of a fio run (errors, written, verified).
fio_result() {
    local f=$1
    printf 'err=%s write=%s read=%s' \
        "$(grep -o 'err= *[0-9]*' "$f" | head -1 | tr -d ' ' | cut -d= -f2)" \
        "$(grep -o 'WRITE: bw=[^,]*, [^,]*, io=[^ ]*' "$f" | grep -o 'io=[^ ]*' | head -1)" \
        "$(grep -o 'READ: bw=[^,]*, [^,]*, io=[^ ]*' "$f" | grep -o 'io=[^ ]*' | head -1)"
}

# bounded SECS CMD...: CMD under a timeout; when it hangs, show what the kernel is waiting for
# (blocked tasks via sysrq-w, the session tree, the kernel log tail) before giving up.
bounded() {
    local secs=$1 rc
    shift
    timeout -k 5 "$secs" "$@"
    rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        log "HUNG for ${secs}s: $*"
        echo w >/proc/sysrq-trigger 2>/dev/null
        iscsiadm -m session -P 3 2>&1 | sed 's/^/    session: /' | head -n 40
        dmesg | tail -n 60 | sed 's/^/    kernel: /'
    fi
    return "$rc"
}

# sectors_written DEV: 512-byte sectors written to DEV so far (field 7 of /sys/block/DEV/stat).
sectors_written() { awk '{print $7}' "/sys/block/$1/stat"; }

# wait_written DEV SECTORS SECS: wait (at most SECS) until SECTORS more have been written to DEV.
wait_written() {
    local goal=$(($(sectors_written "$1") + $2))
    timeout "$3" bash -c 'until [ "$(awk "{print \$7}" /sys/block/$1/stat)" -gt "$2" ]; do sleep 0.2; done' \
        _ "$1" "$goal"
}

# ---- two guests on one private link (run.sh --link) -------------------------------------------
# The guests meet through files in KL_SYNC, a directory both share read-write with the host.
# A guest that gives up leaves "abort" there, so its peer stops waiting at once instead of
# running into its own timeouts.

# peer_say NAME [TEXT]: publish NAME (written aside, then renamed: the peer never sees half).
peer_say() {
    local f=${KL_SYNC:?KL_SYNC: the directory both guests share}/$1
    printf '%s\n' "${2:-}" >"$f.tmp.$BASHPID" && mv -f "$f.tmp.$BASHPID" "$f"
}

# peer_wait NAME SECS: wait (at most SECS) until NAME is published; fails early on "abort".
peer_wait() {
    local name=$1 secs=$2 t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$secs" ]; do
        [ -e "$KL_SYNC/$name" ] && return 0
        if [ -e "$KL_SYNC/abort" ]; then
            log "waiting for $name: the peer gave up ($(cat "$KL_SYNC/abort"))"
            return 1
        fi
        sleep 0.5
    done
    log "waiting for $name: nothing after ${secs}s"
    return 1
}

# peer_get NAME: the text published as NAME.
peer_get() { cat "$KL_SYNC/$1"; }

# link_up ADDR/PREFIX: the guest's NIC on the private link (the only one besides lo and the
# user-mode NIC of the kernel console), with ADDR.
link_up() {
    local nic user
    user=$(_kl_user_nic)
    nic=$(ls /sys/class/net | grep -v -x -e lo ${user:+-e "$user"} | head -1)
    [ -n "$nic" ] || return 1
    ip link set "$nic" up && ip addr add "$1" dev "$nic" && echo "$nic"
}

# wait_listen ADDR:PORT PID SECS: until ADDR:PORT accepts, while PID lives.
wait_listen() {
    timeout "$3" bash -c 'until (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; do
        kill -0 "$2" 2>/dev/null || exit 1; sleep 0.2; done' _ "$1" "$2"
}

# lun_stall CONTROL_SOCKET TARGET LUN true|false: blockwire-target's fault switch
# (`ctl lun.stall`): while stalled, the LUN holds every media command before the backstore.
lun_stall() {
    local r
    r=$("$KL_BIN/blockwire-target" ctl --control "$1" lun.stall \
        "{\"target\":\"$2\",\"lun\":$3,\"stalled\":$4}" 2>&1) ||
        { fail "lun.stall $4: $r"; return 1; }
    log "lun.stall $4: $(tr -s ' \n' ' ' <<<"$r")"
}

# ext4_roundtrip DEV MNT: mkfs.ext4 on DEV, four 8 MiB random files, umount, fsck clean, then
# remount and check every file's sha256.
ext4_roundtrip() {
    local dev=$1 mnt=$2 i
    mkdir -p "$mnt"
    check "mkfs.ext4 $dev" mkfs.ext4 -q -F "$dev"
    if mount "$dev" "$mnt"; then
        for i in 1 2 3 4; do head -c $((8 << 20)) /dev/urandom >"$mnt/f$i"; done
        (cd "$mnt" && sha256sum f1 f2 f3 f4) >"$KL_WORK/ext4-roundtrip.sums"
        check "umount $dev" umount "$mnt"
        check "fsck.ext4 -fn $dev clean" fsck.ext4 -fn "$dev"
        mount "$dev" "$mnt" && (cd "$mnt" && sha256sum -c --quiet "$KL_WORK/ext4-roundtrip.sums") &&
            pass "4 x 8 MiB files read back after remount" || fail "files after remount"
        umount "$mnt"
    else
        fail "mount $dev"
    fi
}

# host_disk HOST LUN: wait (<= 60 s) for LUN of SCSI host HOST (target 0) to appear as a disk,
# print "sdX".
host_disk() {
    local d i
    for i in $(seq 1 300); do
        for d in /sys/class/scsi_host/host"$1"/device/target"$1":0:0/"$1":0:0:"$2"/block/*; do
            if [ -e "$d" ] && [ -b "/dev/${d##*/}" ]; then
                echo "${d##*/}"
                return 0
            fi
        done
        sleep 0.2
    done
    return 1
}
