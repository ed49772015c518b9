#!/usr/bin/env bash
# interop/kernel/guest-kscsi.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# blockwire's kernel SCSI host driver (initiator/kmod/blockwire_scsi.ko, built on the host
# against the lab kernel's headers) with `blockwire attach` serving it from user space:
#   - insmod; attach: the target's LUNs appear as /dev/sdX and /dev/sgN with
#     blockwire-target's INQUIRY data (vendor, product, unit serial as `blockwire inq` reads
#     them over its own session);
#   - fio crc32c verify at QD32; mkfs.ext4, files, fsck clean, read back after a remount;
#   - persistent reservations through the SCSI device from two attached hosts (two I_T
#     nexuses): register, reserve, preempt-and-abort; the preempted host's WRITE gets
#     RESERVATION CONFLICT (fence_scsi's way);
#   - the SCSI error handler: sd's timeout at 5 s while the LUN is stalled
#     (`blockwire-target ctl lun.stall`): ABORT TASK on the wire (interop/kernel/pdu_tap.py
#     relays and checks every TMF), then the I/O completes once the stall is lifted;
#   - a clean detach (SIGTERM): the disks and the host go away, the session logs out;
#   - a crash (kill -9) of the daemon with commands outstanding on a stalled LUN: the kernel
#     fails them (the reader gets EIO) and removes the host, nothing hangs;
#   - rmmod leaves no host, device node or module behind.
# Env: KL_OUT (results dir shared with the host), KL_FIO_MIB (fio size, default 256).
. "$(dirname "$0")/lib.sh"

MIB=${KL_FIO_MIB:-256}
PFX=iqn.2026-11.io.blockwire
IQN=$PFX:lab-kscsi
CTL=$KL_WORK/control.sock
KO=${BLOCKWIRE_BUILD:-$KL_REPO/build}/kmod/blockwire_scsi.ko
ip link set lo up
modprobe -a sd_mod sg || { fail "modprobe sd_mod sg"; finish kscsi; exit 1; }

# --- the module ------------------------------------------------------------------------------
[ -f "$KO" ] || { fail "no module at $KO (initiator/kmod/build.sh builds it)"; finish kscsi; exit 1; }
log "module: $(modinfo -F vermagic "$KO") (running $(uname -r))"
check "insmod blockwire_scsi.ko" insmod "$KO"
[ -c /dev/blockwire-scsi ] && pass "/dev/blockwire-scsi is a character device" ||
    { fail "no /dev/blockwire-scsi"; finish kscsi; exit 1; }

cat >"$KL_WORK/k.toml" <<EOF
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
[[target.lun]]
id = 1
backstore = "ram"
size = "64M"
EOF
start_target target "$KL_WORK/k.toml" || { fail "start blockwire-target"; finish kscsi; exit 1; }
T_PID=$KL_TPID
stall() { lun_stall "$CTL" "$IQN" 0 "$1"; } # true|false

python3 "$(dirname "$0")/pdu_tap.py" 3261 127.0.0.1:3260 "$KL_OUT/pdu-tap.txt" >"$KL_OUT/pdu-tap.log" 2>&1 &
TAP=$!
timeout 20 bash -c 'until grep -q listening "$1"; do sleep 0.2; done' _ "$KL_OUT/pdu-tap.log" ||
    { fail "pdu_tap did not start: $(cat "$KL_OUT/pdu-tap.log")"; finish kscsi; exit 1; }

# attach NAME INITIATOR PORT: start `blockwire attach` (log $KL_OUT/attach-NAME.log); sets
# A_PID and A_HOST (the SCSI host number).
attach() {
    local name=$1 init=$2 port=$3 log=$KL_OUT/attach-$1.log
    "$KL_BIN/blockwire" --initiator-name "$init" attach -p "127.0.0.1:$port" -T "$IQN" --qd 32 \
        >"$log" 2>&1 &
    A_PID=$!
    if ! timeout 120 bash -c 'until grep -q "^blockwire attach: host[0-9]* serves" "$1"; do
            kill -0 "$2" 2>/dev/null || exit 1; sleep 0.2; done' _ "$log" "$A_PID"; then
        fail "blockwire attach ($name) did not attach: $(tail -n 5 "$log" | tr '\n' ' ')"
        return 1
    fi
    A_HOST=$(sed -n 's/^blockwire attach: host\([0-9]*\) serves.*/\1/p' "$log")
    pass "blockwire attach ($name): $(grep '^blockwire attach: host' "$log")"
}
# --- attach and the INQUIRY data -------------------------------------------------------------
attach a iqn.2026-11.lab:kscsi-a 3261 || { finish kscsi; exit 1; }
PID_A=$A_PID HOST_A=$A_HOST
check "host$HOST_A is a blockwire_scsi host" grep -qx blockwire_scsi "/sys/class/scsi_host/host$HOST_A/proc_name"
log "host$HOST_A blockwire_target: $(cat "/sys/class/scsi_host/host$HOST_A/blockwire_target")"
dev=$(host_disk "$HOST_A" 0) || { fail "no disk for LUN 0 on host$HOST_A"; finish kscsi; exit 1; }
dev1=$(host_disk "$HOST_A" 1) && pass "LUN 1 scanned too: /dev/$dev1" || fail "no disk for LUN 1"
sg=$(ls "/sys/block/$dev/device/scsi_generic/")
pass "LUN 0 appears as /dev/$dev and /dev/$sg ($(cat /sys/block/$dev/size) sectors)"
"$KL_BIN/blockwire" --initiator-name iqn.2026-11.lab:kscsi-inq inq -p 127.0.0.1:3260 -T "$IQN" -l 0 \
    >"$KL_OUT/inq-user.txt" 2>&1
sg_inq "/dev/$sg" >"$KL_OUT/inq-kernel.txt" 2>&1
sg_vpd -p sn "/dev/$sg" >>"$KL_OUT/inq-kernel.txt" 2>&1
u_vendor=$(sed -n 's/^Vendor: *//p' "$KL_OUT/inq-user.txt")
u_product=$(sed -n 's/^Product: *//p' "$KL_OUT/inq-user.txt")
u_serial=$(sed -n 's/^Unit serial: *//p' "$KL_OUT/inq-user.txt")
k_vendor=$(sed 's/ *$//' "/sys/block/$dev/device/vendor")
k_model=$(sed 's/ *$//' "/sys/block/$dev/device/model")
k_serial=$(sed -n 's/^ *Unit serial number: *//p' "$KL_OUT/inq-kernel.txt" | head -n 1)
if [ -n "$u_serial" ] && [ "$k_vendor" = "$u_vendor" ] && [ "$k_model" = "$u_product" ] &&
    [ "$k_serial" = "$u_serial" ]; then
    pass "INQUIRY through /dev/$sg matches blockwire-target's: vendor '$k_vendor' product '$k_model' serial $k_serial"
else
    fail "INQUIRY: kernel '$k_vendor'/'$k_model'/'$k_serial' vs target '$u_vendor'/'$u_product'/'$u_serial'"
fi

# --- data ------------------------------------------------------------------------------------
if fio_verify "/dev/$dev" "${MIB}M" >"$KL_OUT/fio-kscsi.log" 2>&1; then
    pass "fio crc32c verify QD32 through /dev/$dev ${MIB}M: $(fio_result "$KL_OUT/fio-kscsi.log")"
else
    fail "fio through /dev/$dev: $(tail -n 5 "$KL_OUT/fio-kscsi.log" | tr '\n' ' ')"
fi
ext4_roundtrip "/dev/$dev" "$KL_WORK/mnt"

# --- persistent reservations from two nexuses (LUN 1) --------------------------------------------------
attach b iqn.2026-11.lab:kscsi-b 3260 || { finish kscsi; exit 1; }
PID_B=$A_PID HOST_B=$A_HOST
# LUN 1 (no file system on it): the writes below would otherwise hit ext4's superblock.
devb=$(host_disk "$HOST_B" 1) || fail "no disk for LUN 1 on host$HOST_B"
log "LUN 1 through host$HOST_A: /dev/$dev1, through host$HOST_B: /dev/$devb"
pr() { sg_persist -n "$@" 2>&1; }
check "host A registers key 0xa" sg_persist -n --out --register --param-sark=0xa "/dev/$dev1"
check "host B registers key 0xb" sg_persist -n --out --register --param-sark=0xb "/dev/$devb"
check "host A reserves (Write Exclusive, Registrants Only)" \
    sg_persist -n --out --reserve --param-rk=0xa --prout-type=5 "/dev/$dev1"
keys=$(pr --in --read-keys "/dev/$devb" | tr -s ' \n' ' ')
echo "$keys" | grep -q 0xa && echo "$keys" | grep -q 0xb && pass "both keys registered: $keys" ||
    fail "read keys: $keys"
res=$(pr --in --read-reservation "/dev/$devb" | tr -s ' \n' ' ')
echo "$res" | grep -q "Key=0xa" && pass "reservation held by 0xa: $res" || fail "reservation: $res"
check "host B preempts and aborts key 0xa (fence_scsi)" \
    sg_persist -n --out --preempt-abort --param-rk=0xb --param-sark=0xa --prout-type=5 "/dev/$devb"
out=$(dd if=/dev/zero of="/dev/$dev1" bs=4k count=1 oflag=direct 2>&1)
if [ $? != 0 ]; then
    pass "preempted host A's write fails: $(echo "$out" | head -n 1)"
else
    fail "preempted host A could still write"
fi
# Checked on a saved log: with pipefail, `dmesg | grep -q` fails when grep stops reading early.
dmesg >"$KL_OUT/dmesg-pr.log"
grep -q "reservation conflict" "$KL_OUT/dmesg-pr.log" &&
    pass "kernel: $(grep 'reservation conflict' "$KL_OUT/dmesg-pr.log" | tail -n 1 | sed 's/^\[[^]]*\] //')" ||
    fail "no reservation conflict in the kernel log"
check "host B writes under its reservation" dd if=/dev/zero of="/dev/$devb" bs=4k count=1 oflag=direct
check "host B releases" sg_persist -n --out --release --param-rk=0xb --prout-type=5 "/dev/$devb"
check "host B clears the registrations" sg_persist -n --out --clear --param-rk=0xb "/dev/$devb"
check "host A writes again after the clear" dd if=/dev/zero of="/dev/$dev1" bs=4k count=1 oflag=direct

# --- clean detach ----------------------------------------------------------------------------
kill -TERM "$PID_B"
if timeout 120 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.2; done' _ "$PID_B"; then
    wait "$PID_B"
    rc=$?
    [ "$rc" = 0 ] && pass "host B detached on SIGTERM: $(tail -n 1 "$KL_OUT/attach-b.log")" ||
        fail "blockwire attach (b) exited $rc: $(tail -n 3 "$KL_OUT/attach-b.log" | tr '\n' ' ')"
else
    fail "blockwire attach (b) still running 120 s after SIGTERM"
    kill -KILL "$PID_B"
fi
[ ! -e "/sys/class/scsi_host/host$HOST_B" ] && [ ! -e "/dev/$devb" ] &&
    pass "host$HOST_B and /dev/$devb are gone" || fail "host$HOST_B or /dev/$devb still there"

# --- the error handler: ABORT TASK -----------------------------------------------------------
echo $(((5 << 0) | (3 << 3))) >/proc/sys/dev/scsi/logging_level
dmesg -C
echo 5 >"/sys/block/$dev/device/timeout"
stall true
dd if="/dev/$dev" of=/dev/null bs=4k count=1 skip=77 iflag=direct >"$KL_OUT/dd-stalled.log" 2>&1 &
DD=$!
if timeout 120 bash -c 'until grep -q "ABORT TASK" "$1"; do sleep 0.5; done' _ "$KL_OUT/attach-a.log"; then
    pass "the kernel's timeout became an ABORT TASK: $(grep -m1 'ABORT TASK' "$KL_OUT/attach-a.log")"
else
    fail "no ABORT TASK within 120 s: $(tail -n 3 "$KL_OUT/attach-a.log" | tr '\n' ' ')"
fi
sleep 3
stall false
if timeout 180 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.5; done' _ "$DD"; then
    wait "$DD" && pass "the stalled read completed after recovery: $(tail -n 1 "$KL_OUT/dd-stalled.log")" ||
        fail "the stalled read failed: $(tail -n 2 "$KL_OUT/dd-stalled.log" | tr '\n' ' ')"
else
    fail "the stalled read still hangs 180 s after the stall was lifted"
    kill -KILL "$DD"
fi
dmesg >"$KL_OUT/dmesg-abort.log"
grep -iE "abort|scsi_eh|timed out|timing out" "$KL_OUT/dmesg-abort.log" | head -n 8 | sed 's/^/    kernel: /'
grep -qi "abort" "$KL_OUT/dmesg-abort.log" && pass "kernel: the command timed out and was aborted" ||
    fail "no abort in the kernel log"
echo 0 >/proc/sys/dev/scsi/logging_level
echo 30 >"/sys/block/$dev/device/timeout"
check "fsck.ext4 -fn /dev/$dev still clean after the abort" fsck.ext4 -fn "/dev/$dev"

# --- the daemon crashes with commands outstanding -------------------------------------------------
stall true
dd if="/dev/$dev" of=/dev/null bs=64k count=4 skip=99 iflag=direct >"$KL_OUT/dd-crash.log" 2>&1 &
DD=$!
timeout 60 bash -c 'until [ "$(awk "{print \$1 + \$2}" /sys/block/$1/inflight)" -gt 0 ]; do sleep 0.2; done' _ "$dev" &&
    log "$(awk '{print $1 + $2}' "/sys/block/$dev/inflight") commands outstanding on the stalled LUN"
kill -KILL "$PID_A"
wait "$PID_A" 2>/dev/null
if timeout 60 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.2; done' _ "$DD"; then
    if wait "$DD"; then
        fail "the read survived the daemon's death?: $(tail -n 1 "$KL_OUT/dd-crash.log")"
    else
        pass "daemon killed: the outstanding read failed instead of hanging: $(head -n 1 "$KL_OUT/dd-crash.log")"
    fi
else
    fail "the read still hangs 60 s after the daemon died"
    kill -KILL "$DD"
fi
timeout 60 bash -c 'while [ -e "/sys/class/scsi_host/host$1" ]; do sleep 0.2; done' _ "$HOST_A" &&
    pass "host$HOST_A removed after the crash" || fail "host$HOST_A still there 60 s after the crash"
[ ! -e "/dev/$dev" ] && pass "/dev/$dev gone" || fail "/dev/$dev still there"
dmesg | grep -E "blockwire_scsi|host$HOST_A" | tail -n 4 | sed 's/^/    kernel: /'
stall false

# --- rmmod -------------------------------------------------------------------------------------
check "rmmod blockwire_scsi" rmmod blockwire_scsi
grep -q "^blockwire_scsi " /proc/modules && fail "blockwire_scsi still loaded" ||
    pass "no blockwire_scsi module, /dev/blockwire-scsi $( [ -e /dev/blockwire-scsi ] && echo present || echo gone), hosts: $(grep -l blockwire_scsi /sys/class/scsi_host/*/proc_name 2>/dev/null | wc -l)"
[ ! -e /dev/blockwire-scsi ] || fail "/dev/blockwire-scsi left behind"
dmesg >"$KL_OUT/dmesg-end.log"
grep -iE "BUG|WARNING|Oops|hung_task|blocked for more" "$KL_OUT/dmesg-end.log" >"$KL_OUT/dmesg-bad.log" &&
    fail "kernel complained: $(head -n 3 "$KL_OUT/dmesg-bad.log" | tr '\n' ' ')" ||
    pass "no BUG, WARNING, Oops or hung task in the kernel log"

kill -TERM "$TAP"
wait "$TAP"
rep=$KL_OUT/pdu-tap.txt
sed 's/^/    tap: /' "$rep" | grep "tap: \(tmf\|unanswered\|violations\)"
grep -q "^tmf ABORT TASK -> " "$rep" && pass "on the wire: $(grep '^tmf ABORT TASK -> ' "$rep")" ||
    fail "no ABORT TASK on the wire"
grep -q "^violations 0$" "$rep" && pass "no Data-In, R2T or SCSI Response after a task was reported aborted" ||
    fail "$(grep -A5 '^violations' "$rep" | tr '\n' ' ')"
grep -q "^unanswered 0$" "$rep" && pass "every TMF answered" || fail "$(grep -A5 '^unanswered' "$rep" | tr '\n' ' ')"
stop_target "$T_PID"
finish kscsi
