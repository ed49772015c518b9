#!/usr/bin/env bash
# interop/kernel/guest-offload.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# Copy offload (ODX: POPULATE TOKEN, WRITE USING TOKEN) from the kernel initiator's /dev/sdX
# by SCSI pass-through, against a blockwire target with a RAM LUN and a file LUN:
#   - sg_vpd decodes the Third-party Copy page (8Fh); sg_opcodes lists the three token commands;
#   - sg_raw sends the commands exactly (odx_raw.py): a token of two ranges of LUN 0 written to
#     LUN 1, read back with O_DIRECT and compared, while the session sends only the parameter
#     lists; OFFSET INTO ROD with DEL_TKN, after which the token is unknown; a token with one
#     byte changed refused (TOKEN CORRUPT) with nothing written;
#   - sg3_utils' ODX implementation, ddpt --odx and ddptctl (which read the page, poll RECEIVE ROD
#     TOKEN INFORMATION and set DEL_TKN), and the block device zero token (ddpt rtype=zero);
#   - EXTENDED COPY (LID1) with ddpt's xcopy, for comparison.
# Env: KL_OUT (results dir shared with the host).
. "$(dirname "$0")/lib.sh"

PFX=iqn.2026-11.io.blockwire
IQN=$PFX:lab-offload
MIB=40
lab_up || { fail "lab-up"; finish offload; exit 1; }
cat >"$KL_WORK/o.toml" <<EOF
[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]
[[target]]
name = "$IQN"
[[target.lun]]
id = 0
backstore = "ram"
size = "128M"
[[target.lun]]
id = 1
backstore = "file"
path = "$KL_WORK/lun1.img"
size = "128M"
EOF
start_target target "$KL_WORK/o.toml" || { fail "start blockwire-target"; finish offload; exit 1; }
T_PID=$KL_TPID
iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3260 >/dev/null
check "login" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 --login
sid=$(session_id "$IQN")
src=$(lun_dev "$sid" 0) && dst=$(lun_dev "$sid" 1) || { fail "LUN disks did not appear"; finish offload; exit 1; }
log "LUN 0 (RAM) /dev/$src, LUN 1 (file) /dev/$dst"

# --- what the initiator tools see ----------------------------------------------------------------
sg_vpd -p tpc "/dev/$src" >"$KL_OUT/vpd-8f.txt" 2>&1
sed 's/^/    sg_vpd: /' "$KL_OUT/vpd-8f.txt" | head -n 40
if grep -qi "ROD token limits" "$KL_OUT/vpd-8f.txt" && grep -qi "Maximum range descriptors: *64" "$KL_OUT/vpd-8f.txt"; then
    pass "sg_vpd decodes the Third-party Copy page: $(grep -i 'Maximum range descriptors' "$KL_OUT/vpd-8f.txt" | xargs)"
else
    fail "sg_vpd -p tpc: no Block Device ROD Token Limits descriptor"
fi
ops=$(sg_opcodes "/dev/$src" 2>&1)
n=$(echo "$ops" | grep -ciE "populate token|write using token|receive rod token")
echo "$ops" | grep -iE "populate token|write using token|receive rod token" | sed 's/^/    sg_opcodes: /'
[ "$n" -ge 3 ] && pass "REPORT SUPPORTED OPERATION CODES lists the three token commands" ||
    fail "sg_opcodes lists $n of the three token commands"

# --- exact commands through sg_raw ---------------------------------------------------------------
RAW="python3 $(dirname "$0")/odx_raw.py"
dd if=/dev/urandom of="$KL_WORK/data" bs=1M count=$MIB status=none
dd if="$KL_WORK/data" of="/dev/$src" bs=1M oflag=direct status=none
cmp_dev() { # DEV SKIP_MIB FILE: the device's bytes (O_DIRECT) against FILE
    dd if="/dev/$1" bs=1M skip="$2" count=$(($(stat -c %s "$3") >> 20)) iflag=direct status=none | cmp - "$3"
}
part() { # FILE FROM_MIB MIB: that part of FILE
    tail -c +$((($2 << 20) + 1)) "$1" | head -c $(($3 << 20))
}
# The bytes the session sent (Data-Out and immediate data, iscsiadm's txdata_octets): an
# offloaded copy adds only its parameter lists.
txbytes() { iscsiadm -m session -r "$sid" -s 2>/dev/null | awk '/txdata_octets/ {print $2}'; }
before=$(txbytes)
# A token of MiB 0-8 and 16-24 of LUN 0 (two ranges), written to LUN 1 at MiB 32 (one range).
if out=$($RAW populate "/dev/$src" 11 "$KL_WORK/t1" 0:16384,32768:16384); then
    pass "POPULATE TOKEN + RECEIVE ROD TOKEN INFORMATION: $out, token $(stat -c %s "$KL_WORK/t1") bytes"
else
    fail "POPULATE TOKEN: $out"
fi
if out=$($RAW write "/dev/$dst" 12 "$KL_WORK/t1" 0 65536:32768); then
    pass "WRITE USING TOKEN on LUN 1: $out"
else
    fail "WRITE USING TOKEN: $out"
fi
after=$(txbytes)
{ part "$KL_WORK/data" 0 8; part "$KL_WORK/data" 16 8; } >"$KL_WORK/want1"
check "LUN 1 at MiB 32 holds LUN 0's MiB 0-8 then 16-24 (read back with O_DIRECT)" cmp_dev "$dst" 32 "$KL_WORK/want1"
sent=$((after - before))
[ -n "$before" ] && [ "$sent" -lt 65536 ] &&
    pass "16 MiB copied while the session sent $sent bytes (the parameter lists)" ||
    fail "the session sent ${sent:-?} bytes during a 16 MiB offloaded copy"
# OFFSET INTO ROD: from block 12288 (MiB 6) of the token, 4 MiB, to LUN 0 at MiB 60.
if out=$($RAW write "/dev/$src" 13 "$KL_WORK/t1" 12288 122880:8192 del); then
    pass "WRITE USING TOKEN from OFFSET INTO ROD 12288 with DEL_TKN: $out"
else
    fail "WRITE USING TOKEN with an offset: $out"
fi
{ part "$KL_WORK/data" 6 2; part "$KL_WORK/data" 16 2; } >"$KL_WORK/want2"
check "LUN 0 at MiB 60 holds token blocks 12288-20480 (MiB 6-8, then 16-18)" cmp_dev "$src" 60 "$KL_WORK/want2"
# DEL_TKN took the token away.
out=$($RAW write "/dev/$dst" 14 "$KL_WORK/t1" 0 0:8)
[ $? = 3 ] && echo "$out" | grep -qi "token unknown" &&
    pass "the token is gone after DEL_TKN: ${out:0:160}" || fail "a deleted token: $out"
# A token with one byte of its random part changed: refused, nothing written.
$RAW populate "/dev/$src" 15 "$KL_WORK/t2" 0:8192 >/dev/null || fail "POPULATE TOKEN for the changed token"
cp "$KL_WORK/t2" "$KL_WORK/bad"
printf '\x5a' | dd of="$KL_WORK/bad" bs=1 seek=140 conv=notrunc status=none
dd if=/dev/zero of="/dev/$dst" bs=1M seek=120 count=4 oflag=direct status=none
head -c $((4 << 20)) /dev/zero >"$KL_WORK/zero4"
out=$($RAW write "/dev/$dst" 16 "$KL_WORK/bad" 0 245760:8192)
[ $? = 3 ] && echo "$out" | grep -qi "token corrupt" &&
    pass "a changed token is refused: ${out:0:160}" || fail "a changed token: $out"
check "nothing was written with it" cmp_dev "$dst" 120 "$KL_WORK/zero4"

# --- ddpt and ddptctl -----------------------------------------------------------------------------
# ddpt 0.97 (Debian 12's, the one this runs) writes its range descriptors one byte early: for
# skip=L,N the target reads LBA L*256, N*256 blocks (sg_raw above sends them exactly). The
# checks below are on what the target read, and so on that quirk: skip=0,40 is 10240 blocks.
if ddpt --odx if="/dev/$src" iflag=pt of="/dev/$dst" oflag=pt bs=512 skip=0,40 seek=0,40 \
    >"$KL_OUT/ddpt-odx.txt" 2>&1; then
    pass "ddpt --odx (VPD 8Fh read, POPULATE TOKEN, RECEIVE ROD TOKEN INFORMATION, WRITE USING TOKEN with DEL_TKN)"
else
    fail "ddpt --odx (exit $?): $(tail -n 5 "$KL_OUT/ddpt-odx.txt" | tr '\n' ' ')"
fi
part "$KL_WORK/data" 0 5 >"$KL_WORK/want3"
check "LUN 1 starts with LUN 0's first 5 MiB (10240 blocks)" cmp_dev "$dst" 0 "$KL_WORK/want3"
if out=$(ddptctl --pt=0,16 --rtf="$KL_WORK/t3" "/dev/$src" 2>&1); then
    echo "$out" | grep -q "transfer count of 4096" && pass "ddptctl --pt: $(echo "$out" | head -n 1)" ||
        fail "ddptctl --pt: $out"
else
    fail "ddptctl --pt (exit $?): $out"
fi
if out=$(ddptctl --wut=400,16 --rtf="$KL_WORK/t3" "/dev/$dst" 2>&1); then
    echo "$out" | grep -q "transfer count of 4096" && pass "ddptctl --wut: $(echo "$out" | head -n 1)" ||
        fail "ddptctl --wut: $out"
else
    fail "ddptctl --wut (exit $?): $out"
fi
part "$KL_WORK/data" 0 2 >"$KL_WORK/want4"
check "LUN 1 at MiB 50 (block 102400) holds LUN 0's first 2 MiB" cmp_dev "$dst" 50 "$KL_WORK/want4"
# The block device zero token: blocks 2048-6144 (MiB 1-3) of LUN 1 zeroed, nothing beside them.
if ddpt if=/dev/null rtype=zero bs=512 of="/dev/$dst" oflag=pt seek=8,16 >"$KL_OUT/ddpt-zero.txt" 2>&1; then
    pass "ddpt rtype=zero (WRITE USING TOKEN with the block device zero token)"
else
    fail "ddpt rtype=zero (exit $?): $(tail -n 5 "$KL_OUT/ddpt-zero.txt" | tr '\n' ' ')"
fi
zeroed() {
    dd if="/dev/$dst" bs=1M skip=1 count=2 iflag=direct status=none | cmp - <(head -c $((2 << 20)) /dev/zero) &&
        dd if="/dev/$dst" bs=1M count=1 iflag=direct status=none | cmp - <(part "$KL_WORK/data" 0 1) &&
        dd if="/dev/$dst" bs=1M skip=3 count=2 iflag=direct status=none | cmp - <(part "$KL_WORK/data" 3 2)
}
check "MiB 1-3 of LUN 1 are zeros, MiB 0 and 3-5 as copied" zeroed

# --- EXTENDED COPY (LID1), for comparison -----------------------------------------------------------
if ddpt if="/dev/$src" iflag=pt,xcopy of="/dev/$dst" oflag=pt bs=512 count=8192 seek=$((110 * 2048)) \
    >"$KL_OUT/ddpt-xcopy.txt" 2>&1; then
    pass "ddpt xcopy (EXTENDED COPY LID1)"
else
    fail "ddpt xcopy (exit $?): $(tail -n 5 "$KL_OUT/ddpt-xcopy.txt" | tr '\n' ' ')"
fi
part "$KL_WORK/data" 0 4 >"$KL_WORK/first4"
check "LUN 1 at 110 MiB holds LUN 0's first 4 MiB" cmp_dev "$dst" 110 "$KL_WORK/first4"
grep -cE "populate token|write using token" "$KL_OUT/target.log" | sed 's/^/    target log: token operations: /'

check "logout" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 --logout
stop_target "$T_PID"
finish offload
