#!/usr/bin/env bash
# interop/kernel/guest-thin.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# Thin provisioning with a soft threshold (SBC-4 4.7.3.7), seen from Linux's sd and sg3_utils:
# a 256 MiB sparse file LUN on a 48 MiB tmpfs, `low_space_threshold = "16M"`.
#   - sg_vpd's Logical Block Provisioning page shows the threshold exponent, sg_logs decodes
#     the Logical Block Provisioning log page (available and used resource counts, their
#     scope), sg_modes reads the logical block provisioning mode page (1Ch/02h);
#   - 24 MiB written through /dev/sdX leave about 24: no warning; 36 MiB leave about 12, below
#     the threshold: the kernel logs "reached a thin provisioning soft threshold" once, and sends
#     the uevent SDEV_UA=THIN_PROVISIONING_SOFT_THRESHOLD_REACHED (udevadm monitor);
#   - writing on until the tmpfs is full: the write that finds no space fails (DATA PROTECT,
#     SPACE ALLOCATION FAILED WRITE PROTECT in the kernel log), and every byte written before
#     it reads back intact; the target serves on.
# Env: KL_OUT (results dir shared with the host).
. "$(dirname "$0")/lib.sh"

IQN=iqn.2026-12.io.blockwire:lab-thin
lab_up || { fail "lab-up"; finish thin; exit 1; }

mkdir -p "$KL_WORK/thin"
mount -t tmpfs -o size=48m tmpfs "$KL_WORK/thin" || { fail "tmpfs"; finish thin; exit 1; }
cat >"$KL_WORK/thin.toml" <<EOF
[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]
[[target]]
name = "$IQN"
[[target.lun]]
id = 0
backstore = "file"
path = "$KL_WORK/thin/lun0.img"
size = "256M"
low_space_threshold = "16M"
EOF
start_target target "$KL_WORK/thin.toml" || { fail "start blockwire-target"; finish thin; exit 1; }
T_PID=$KL_TPID

udevadm monitor --kernel --property --subsystem-match=scsi >"$KL_OUT/uevents.log" 2>&1 &
U_PID=$!
iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3260 >/dev/null
check "login" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 --login
sid=$(session_id "$IQN")
dev=$(lun_dev "$sid" 0) || { fail "LUN 0 did not appear"; finish thin; exit 1; }
log "LUN 0 is /dev/$dev ($(blockdev --getsize64 "/dev/$dev") bytes) on a 48 MiB tmpfs"

# --- what sg3_utils reads -------------------------------------------------------------------
vpd=$(sg_vpd -p lbpv "/dev/$dev" 2>&1)
echo "$vpd" | sed 's/^/    sg_vpd: /'
echo "$vpd" | grep -Eiq "threshold exponent: *11" &&
    pass "VPD B2h: threshold exponent 11 (1 MiB threshold sets of 512-byte blocks)" ||
    fail "VPD B2h threshold exponent"
logs=$(sg_logs -p 0xc "/dev/$dev" 2>&1)
echo "$logs" | sed 's/^/    sg_logs: /'
# sg_logs says e.g. "Available LBA mapping threshold resource count: 47" then its scope.
count() { echo "$logs" | grep -Ei "$1 LBA mapping .*resource count: *[0-9]+" | grep -Eo "[0-9]+$" | head -n 1; }
avail=$(count available) used=$(count used)
if [ -n "$avail" ] && [ "$avail" -ge 44 ] && [ "$avail" -le 48 ]; then
    pass "sg_logs -p 0xc: $avail MiB available of the 48 MiB tmpfs"
else
    fail "sg_logs -p 0xc available count: '$avail'"
fi
[ "$used" = 0 ] && echo "$logs" | grep -qi "scope: dedicated to lu" &&
    echo "$logs" | grep -qi "scope: not dedicated to lu" &&
    pass "sg_logs -p 0xc: used 0, the free space shared, the used space the LUN's own" ||
    fail "sg_logs used count '$used' or scopes"
sg_modes -p 0x1c,2 "/dev/$dev" 2>&1 | sed 's/^/    sg_modes: /'
# The threshold descriptor: ENABLED, soft, armed decreasing, resource 01h, count 16 (00000010h).
modes=$(sg_modes -p 0x1c,2 --raw "/dev/$dev" 2>/dev/null | od -An -tx1 | tr -d ' \n')
log "MODE SENSE 1Ch/02h: $modes"
echo "$modes" | grep -q "8001000000000010" &&
    pass "mode page 1Ch/02h: one enabled soft threshold of 16 sets on available resources" ||
    fail "mode page 1Ch/02h threshold descriptor"

warnings() { dmesg | grep -c "reached a thin provisioning soft threshold" || true; }
# --- 24 MiB written: 24 left, no warning ------------------------------------------------------
check "24 MiB written" dd if=/dev/urandom of="$KL_WORK/first.bin" bs=1M count=24 status=none
check "24 MiB to /dev/$dev" dd if="$KL_WORK/first.bin" of="/dev/$dev" bs=1M oflag=direct status=none
sleep 3
sg_turs "/dev/$dev" >/dev/null 2>&1
sleep 1
[ "$(warnings)" = 0 ] && pass "no warning with about 24 MiB left" || fail "warned early: $(warnings)"

# --- 12 more: about 12 MiB left, below the threshold -----------------------------------------
check "12 MiB more" dd if=/dev/urandom of="$KL_WORK/second.bin" bs=1M count=12 status=none
check "12 MiB more to /dev/$dev" dd if="$KL_WORK/second.bin" of="/dev/$dev" bs=1M seek=24 oflag=direct status=none
# The target looks once a second; the kernel hears it with its next command. A slow guest
# (software-emulated CPU on a busy host) gets up to a minute.
for i in $(seq 1 120); do
    sleep 0.5
    sg_turs "/dev/$dev" >/dev/null 2>&1
    [ "$(warnings)" -ge 1 ] && break
done
dmesg | grep -i "thin provisioning" | sed 's/^/    kernel: /'
[ "$(warnings)" = 1 ] && pass "the kernel logged the soft threshold once" ||
    fail "kernel soft-threshold messages: $(warnings)"
# udev's monitor writes the event some time after the kernel logged it.
for i in $(seq 1 60); do
    grep -q "SDEV_UA=THIN_PROVISIONING_SOFT_THRESHOLD_REACHED" "$KL_OUT/uevents.log" && break
    sleep 0.5
done
grep -q "SDEV_UA=THIN_PROVISIONING_SOFT_THRESHOLD_REACHED" "$KL_OUT/uevents.log" &&
    pass "uevent SDEV_UA=THIN_PROVISIONING_SOFT_THRESHOLD_REACHED" ||
    fail "no soft-threshold uevent: $(grep -c SDEV_UA "$KL_OUT/uevents.log") SDEV_UA lines"
grep -q "low on space" "$KL_OUT/target.log" && pass "the target logged it" || fail "target log"
logs=$(sg_logs -p 0xc "/dev/$dev" 2>&1)
avail=$(count available) used=$(count used)
[ "$used" = 36 ] && [ -n "$avail" ] && [ "$avail" -le 12 ] &&
    pass "sg_logs -p 0xc after 36 MiB: $used used, $avail available" ||
    fail "sg_logs -p 0xc after 36 MiB: used '$used', available '$avail'"
# Lower still (4 MiB more): no second warning.
dd if=/dev/urandom of="/dev/$dev" bs=1M seek=36 count=4 oflag=direct status=none
sleep 3
sg_turs "/dev/$dev" >/dev/null 2>&1
[ "$(warnings)" = 1 ] && pass "no second warning further down" || fail "warned again: $(warnings)"

# --- on until the tmpfs is full -------------------------------------------------------------
if dd if=/dev/urandom of="/dev/$dev" bs=1M seek=40 count=64 oflag=direct status=none 2>"$KL_WORK/full.err"; then
    fail "64 MiB more went onto a 48 MiB tmpfs"
else
    pass "the write past the tmpfs's end failed: $(head -n 1 "$KL_WORK/full.err")"
fi
dmesg | grep -i "space allocation failed" | head -n 2 | sed 's/^/    kernel: /'
kernel_log_has -i "space allocation failed write protect" &&
    pass "the kernel saw DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT" ||
    fail "no space-allocation sense in the kernel log"
cat "$KL_WORK/first.bin" "$KL_WORK/second.bin" >"$KL_WORK/both.bin"
if cmp <(dd if="/dev/$dev" bs=1M count=36 iflag=direct status=none) "$KL_WORK/both.bin"; then
    pass "the 36 MiB written before read back intact"
else
    fail "data written before the file system filled differs"
fi
kill -0 "$T_PID" && pass "the target serves on" || fail "the target exited"

check "logout" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 --logout
kill "$U_PID" 2>/dev/null
stop_target "$T_PID"
umount "$KL_WORK/thin"
finish thin
