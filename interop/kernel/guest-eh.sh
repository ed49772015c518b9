#!/usr/bin/env bash
# interop/kernel/guest-eh.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# The Linux SCSI error handler against a stalled blockwire LUN. The daemon's fault switch
# (`blockwire-target ctl lun.stall`) holds every media command of LUN 0 before the backstore
# while fio writes and verifies through /dev/sdX. Between the kernel initiator and the target
# sits interop/kernel/pdu_tap.py, a TCP relay that frames every PDU and checks that each TMF
# is answered and that no Data-In, R2T or SCSI Response ever follows a "Function complete" for
# the tasks it covered.
#   Phase 1, the kernel on its own: sd's command timeout at 5 s: the timed-out commands are
#     aborted (ABORT TASK), retried, time out again and go to the error handler (abort, TUR);
#     then the stall is lifted.
#   Phase 2, the escalation ladder driven through the kernel's own reset paths (sg_reset ->
#     scsi_ioctl_reset -> the iSCSI EH handlers): LUN RESET, TARGET WARM RESET, then the
#     connection is reset under the held commands (the relay drops it, as a failed path would):
#     the kernel drops the session and logs in again; then the stall is lifted.
# After each phase fio must finish with every verify passing. The kernel's EH messages
# (scsi logging and libiscsi's EH debug switched on) are printed.
# Env: KL_OUT (results dir shared with the host), KL_FIO_MIB (scaled down here: MIB/4).
. "$(dirname "$0")/lib.sh"

MIB=$(( ${KL_FIO_MIB:-256} / 4 ))
PFX=iqn.2026-11.io.blockwire
IQN=$PFX:lab-eh
CTL=$KL_WORK/control.sock
export KL_INITIATOR=iqn.2026-11.lab:kernel-guest
lab_up || { fail "lab-up"; finish eh; exit 1; }

cat >"$KL_WORK/e.toml" <<EOF
[fabric]
nop_interval_secs = 5
nop_timeout_secs = 30

[control]
socket = "$CTL"

[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]

[[target]]
name = "$IQN"
[[target.lun]]
id = 0
backstore = "ram"
size = "$((MIB + 64))M"
EOF
start_target eh "$KL_WORK/e.toml" || { fail "start blockwire-target"; finish eh; exit 1; }
T_PID=$KL_TPID
stall() { lun_stall "$CTL" "$IQN" 0 "$1"; } # true|false

check "pdu_tap catches planted faults" python3 "$(dirname "$0")/pdu_tap.py" --self-test
python3 "$(dirname "$0")/pdu_tap.py" 3261 127.0.0.1:3260 "$KL_OUT/pdu-tap.txt" >"$KL_OUT/pdu-tap.log" 2>&1 &
TAP=$!
timeout 20 bash -c 'until grep -q listening "$1"; do sleep 0.2; done' _ "$KL_OUT/pdu-tap.log" ||
    { fail "pdu_tap did not start: $(cat "$KL_OUT/pdu-tap.log")"; finish eh; exit 1; }

# The node points at the relay (no discovery: SendTargets would name the target's own portal).
iscsiadm -m node -o new -T "$IQN" -p 127.0.0.1:3261 >/dev/null
for kv in node.session.err_timeo.abort_timeout=5 node.session.err_timeo.lu_reset_timeout=5 \
    node.session.err_timeo.tgt_reset_timeout=5 node.session.timeo.replacement_timeout=60 \
    'node.conn[0].iscsi.HeaderDigest=None' 'node.conn[0].iscsi.DataDigest=None'; do
    iscsiadm -m node -T "$IQN" -p 127.0.0.1:3261 -o update -n "${kv%%=*}" -v "${kv#*=}" >/dev/null
done
check "login through the relay" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3261 --login
sid=$(session_id "$IQN")
dev=$(lun_dev "$sid" 0) || { fail "no disk"; finish eh; exit 1; }
sg=$(ls "/sys/block/$dev/device/scsi_generic/")
log "LUN 0 = /dev/$dev (/dev/$sg), session $sid"
# SCSI logging: error recovery (bits 0-2) at 5 and timeouts (bits 3-5) at 3, and libiscsi's
# EH debug messages: what the kernel decides, in its own words.
echo $(((5 << 0) | (3 << 3))) >/proc/sys/dev/scsi/logging_level
echo 1 >/sys/module/libiscsi/parameters/debug_libiscsi_eh 2>/dev/null || true
dmesg -C

inflight() { awk '{print $1 + $2}' "/sys/block/$dev/inflight"; }
wait_inflight() { # wait (<= 120 s) until commands are outstanding on the stalled LUN
    timeout 120 bash -c 'until [ "$(awk "{print \$1 + \$2}" /sys/block/$1/inflight)" -gt 0 ]; do sleep 0.2; done' _ "$dev"
}
start_fio() { # TAG
    fio_verify "/dev/$dev" "${MIB}M" >"$KL_OUT/fio-$1.log" 2>&1 &
    FIO=$!
    wait_written "$dev" 8192 120
}
end_fio() { # TAG
    if wait "$FIO"; then
        pass "fio verify ($1) after the stall was lifted: $(fio_result "$KL_OUT/fio-$1.log")"
    else
        fail "fio ($1): $(tail -n 5 "$KL_OUT/fio-$1.log" | tr '\n' ' ')"
    fi
}

# --- phase 1: the kernel's own timeouts --------------------------------------------------------
log "phase 1: sd timeout 5 s, LUN stalled while fio runs"
echo 5 >"/sys/block/$dev/device/timeout"
start_fio eh-timeouts
stall true
wait_inflight && log "$(inflight) commands held by the stalled LUN"
# libiscsi first asks for more time while the connection still moves data ("Command making
# progress"); once it has been idle for a timeout, the SCSI layer aborts (ABORT TASK), retries,
# and a second timeout of a retried command goes to the EH thread. Wait for the aborts, then
# give the retries one more timeout before lifting the stall.
if timeout 120 bash -c 'until dmesg | grep -q "iscsi_eh_abort\|aborting \[sc\|aborting command"; do sleep 0.5; done'; then
    log "the kernel is aborting the timed-out commands"
else
    log "no abort within 120 s"
fi
sleep 8
stall false
end_fio eh-timeouts
dmesg | grep -iE "abort|scsi_eh|reset|timing out|timed out" | grep -v "timer reset\|return timer" | head -n 16 | sed 's/^/    kernel: /'
# Checked on the saved log: with pipefail, `dmesg | grep -q` fails when grep stops reading early.
dmesg >"$KL_OUT/dmesg-eh-phase1.log"
grep -qiE "abort" "$KL_OUT/dmesg-eh-phase1.log" && pass "kernel aborted timed-out commands (ABORT TASK)" ||
    fail "no abort in the kernel log"
dmesg -C

# --- phase 2: LUN RESET, TARGET WARM RESET, session drop and re-login ----------------------------
log "phase 2: resets through the kernel's EH handlers while the LUN is stalled"
echo 120 >"/sys/block/$dev/device/timeout" # no timeouts of its own: the resets are the EH here
start_fio eh-resets
stall true
wait_inflight && log "$(inflight) commands held"
check "sg_reset -d (LUN RESET) while the LUN is stalled" sg_reset -d "/dev/$sg"
wait_inflight && log "$(inflight) commands held (retried after the LUN RESET)"
check "sg_reset -t (target reset) while the LUN is stalled" sg_reset -t "/dev/$sg"
wait_inflight && log "$(inflight) commands held (retried after the target reset)"
# iscsi_tcp has no host or bus reset handler: the kernel drops and re-logs in a session when the
# connection fails. The relay resets the TCP connection (a failed path) with commands held.
kill -USR1 "$TAP"
# The kernel may fail the connection and log in again between two looks at the session's
# state, so its own "detected conn error" line counts as noticing too.
if timeout 60 bash -c 'until [ "$(cat /sys/class/iscsi_session/session$1/state)" != LOGGED_IN ] ||
        dmesg | grep -q "detected conn error"; do sleep 0.1; done' _ "$sid"; then
    pass "connection reset under held commands: session $sid in recovery ($(cat "/sys/class/iscsi_session/session$sid/state"); $(dmesg | grep -m1 -o 'connection[0-9:]*: detected conn error.*'))"
else
    fail "the session never noticed the connection reset"
fi
if timeout 120 bash -c 'until [ "$(cat /sys/class/iscsi_session/session$1/state)" = LOGGED_IN ]; do sleep 0.5; done' _ "$sid"; then
    pass "session $sid logged in again (session drop and re-login) with the LUN still stalled"
else
    fail "session $sid: $(cat "/sys/class/iscsi_session/session$sid/state")"
fi
wait_inflight && log "$(inflight) commands held (resent after the re-login)"
grep -c "login complete: full feature phase" "$KL_OUT/eh.log" | {
    read -r n
    [ "$n" -ge 2 ] && pass "the target saw $n logins (the first and the re-login)" || fail "logins seen: $n"
}
sleep 3
stall false
end_fio eh-resets
dmesg | grep -iE "reset|abort|scsi_eh|conn error|session recovery|iscsi_eh" | grep -v "timer reset" | head -n 24 | sed 's/^/    kernel: /'
dmesg >"$KL_OUT/dmesg-eh-phase2.log"

echo 0 >/proc/sys/dev/scsi/logging_level
check "logout" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3261 --logout
kill -TERM "$TAP"
wait "$TAP"
sed 's/^/    tap: /' "$KL_OUT/pdu-tap.txt" | grep -v "^    tap:   [0-9:]* conn .*: \(connected\|closed\)$" | head -n 60
rep=$KL_OUT/pdu-tap.txt
grep -q "^violations 0$" "$rep" && pass "no Data-In, R2T or SCSI Response after a task was reported aborted" ||
    fail "$(grep -A5 '^violations' "$rep" | tr '\n' ' ')"
grep -q "^unanswered 0$" "$rep" && pass "every TMF answered" || fail "$(grep -A5 '^unanswered' "$rep" | tr '\n' ' ')"
for fn in "ABORT TASK" "LUN RESET" "TARGET WARM RESET"; do
    grep -q "^tmf $fn -> " "$rep" && pass "TMF $fn: $(grep "^tmf $fn -> " "$rep" | tr '\n' ' ')" ||
        fail "no $fn went through"
done
slow=$(sed -n 's/^tmf_slowest_seconds //p' "$rep")
# The kernel gives each TMF abort_timeout/lu_reset_timeout/tgt_reset_timeout (5 s here).
awk -v s="$slow" 'BEGIN { exit !(s < 5) }' && pass "slowest TMF response ${slow} s (kernel allows 5 s)" ||
    fail "slowest TMF response ${slow} s"
stop_target "$T_PID"
finish eh
