#!/usr/bin/env bash
# interop/kernel/guest-pi.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# T10 protection information, Type 1 (SBC-3 4.18), seen from Linux's sd and sg3_utils: a 64 MiB
# file LUN on a tmpfs, `protection = "type1"`, its tuples in lun0.img.protection.
#   - the kernel reads PROTECT in INQUIRY and PROT_EN in READ CAPACITY (16) ("DIF Type 1" in its
#     log: iscsi_tcp hosts carry no protection information, so sd sends plain READs and WRITEs
#     and the target generates and checks the tuples); sg_readcap, sg_vpd -p ei and sg_inq agree;
#   - fio's crc32c verify of 4 KiB-1 MiB writes at QD32 passes through the checks;
#   - READ(16) with RDPROTECT=1 (sg_raw) returns each block followed by its tuple: the guard
#     is the CRC-16 T10-DIF of the block (computed here by python3), the reference tag the LBA;
#   - a byte changed in the backing file behind the target's back: the next READ of that block
#     fails (ABORTED COMMAND, LOGICAL BLOCK GUARD CHECK FAILED, INFORMATION the LBA; the kernel
#     logs a protection error and dd fails) instead of returning the changed data; the blocks
#     around it read; a target restart keeps the tuples (the block still fails, the others pass);
#     rewriting the block heals it;
#   - WRITE(10) with WRPROTECT=1 and a wrong guard is refused with nothing written; with the
#     right one and application tag BEEFh it is kept, the tag read back as sent;
#   - blkdiscard (UNMAP) leaves tuples of FFh, which are never checked.
# Env: KL_OUT (results dir shared with the host).
. "$(dirname "$0")/lib.sh"

IQN=iqn.2026-12.io.blockwire:lab-pi
lab_up || { fail "lab-up"; finish pi; exit 1; }

mkdir -p "$KL_WORK/pi"
mount -t tmpfs -o size=256m tmpfs "$KL_WORK/pi" || { fail "tmpfs"; finish pi; exit 1; }
IMG=$KL_WORK/pi/lun0.img
cat >"$KL_WORK/pi.toml" <<EOF
[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]
[[target]]
name = "$IQN"
[[target.lun]]
id = 0
backstore = "file"
path = "$IMG"
size = "64M"
protection = "type1"
EOF
start_target target "$KL_WORK/pi.toml" || { fail "start blockwire-target"; finish pi; exit 1; }
T_PID=$KL_TPID

login() {
    iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3260 >/dev/null
    check "login" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 --login
    sid=$(session_id "$IQN")
    dev=$(lun_dev "$sid" 0) || { fail "LUN 0 did not appear"; finish pi; exit 1; }
}
login
log "LUN 0 is /dev/$dev ($(blockdev --getsize64 "/dev/$dev") bytes)"
[ "$(stat -c %s "$IMG.protection")" = $((131072 * 8)) ] &&
    pass "the tuples' file beside the image: 131072 blocks x 8 bytes" ||
    fail "tuples' file: $(ls -l "$IMG.protection" 2>&1)"

# --- what the kernel and sg3_utils read ------------------------------------------------------
dmesg | grep -i "DIF Type" | sed 's/^/    kernel: /'
kernel_log_has "DIF Type 1 protection" &&
    pass "sd saw Type 1 protection (PROTECT in INQUIRY, PROT_EN in READ CAPACITY (16))" ||
    fail "no 'DIF Type 1 protection' line from sd"
rc=$(sg_readcap -l "/dev/$dev" 2>&1)
echo "$rc" | grep -i "prot" | sed 's/^/    sg_readcap: /'
echo "$rc" | grep -Eiq "prot_en=1, p_type=0" && pass "sg_readcap: prot_en=1, p_type=0" ||
    fail "sg_readcap protection fields"
ei=$(sg_vpd -p ei "/dev/$dev" 2>&1)
echo "$ei" | grep -Ei "SPT|GRD_CHK" | sed 's/^/    sg_vpd: /'
echo "$ei" | grep -Eq "GRD_CHK=1" && echo "$ei" | grep -Eq "APP_CHK=0" && echo "$ei" | grep -Eq "REF_CHK=1" &&
    pass "VPD 86h: GRD_CHK=1 APP_CHK=0 REF_CHK=1" || fail "VPD 86h check bits"
sg_inq "/dev/$dev" 2>&1 | grep -Eq "Protect=1" && pass "standard INQUIRY: Protect=1" ||
    fail "standard INQUIRY Protect bit"

# --- data through sd: generated on write, checked on read -------------------------------------
if fio_verify "/dev/$dev" 32M --offset=16M >"$KL_OUT/fio-pi.log" 2>&1; then
    pass "fio crc32c verify, 32 MiB of 4 KiB-1 MiB writes at QD32 ($(fio_result "$KL_OUT/fio-pi.log"))"
else
    fail "fio verify ($(fio_result "$KL_OUT/fio-pi.log"))"
fi
check "16 blocks of random data" dd if=/dev/urandom of="$KL_WORK/blocks.bin" bs=512 count=16 status=none
check "written to LBAs 0-15" dd if="$KL_WORK/blocks.bin" of="/dev/$dev" bs=512 oflag=direct status=none

# tuple FILE N: the tuple after block N of a READ with RDPROTECT, as "guard app ref" in hex.
tuple() { python3 -c '
import sys
b = open(sys.argv[1], "rb").read()
u = b[int(sys.argv[2]) * 520:][:520]
t = u[512:]
print(t[0:2].hex(), t[2:4].hex(), t[4:8].hex())' "$1" "$2"; }
# crc FILE N: the CRC-16 T10-DIF (polynomial 8BB7h) of 512-byte block N of FILE.
crc() { python3 -c '
import sys
d = open(sys.argv[1], "rb").read()[int(sys.argv[2]) * 512:][:512]
c = 0
for x in d:
    c ^= x << 8
    for _ in range(8):
        c = ((c << 1) ^ 0x8BB7 if c & 0x8000 else c << 1) & 0xFFFF
print("%04x" % c)' "$1" "$2"; }
# read_pi LBA COUNT OUT: READ(16), RDPROTECT=001b, COUNT blocks with their tuples into OUT.
read_pi() {
    sg_raw -r $(($2 * 520)) -o "$3" "/dev/$dev" 88 20 00 00 00 00 $(printf '%02x %02x %02x %02x' \
        $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255))) \
        00 00 00 $(printf %02x "$2") 00 00 2>"$KL_WORK/sg_raw.err"
}

if read_pi 4 3 "$KL_WORK/pi3.bin"; then
    ok=1
    for i in 0 1 2; do
        lba=$((4 + i))
        got=$(tuple "$KL_WORK/pi3.bin" $i) want="$(crc "$KL_WORK/blocks.bin" $lba) 0000 $(printf %08x $lba)"
        log "LBA $lba: tuple $got, expected $want"
        [ "$got" = "$want" ] || ok=0
        cmp -s <(dd if="$KL_WORK/pi3.bin" bs=520 skip=$i count=1 status=none | head -c 512) \
            <(dd if="$KL_WORK/blocks.bin" bs=512 skip=$lba count=1 status=none) || ok=0
    done
    [ $ok = 1 ] && pass "READ(16) RDPROTECT=1: each block followed by its CRC guard, tag 0, its LBA" ||
        fail "READ(16) RDPROTECT=1 tuples"
else
    fail "READ(16) RDPROTECT=1: $(cat "$KL_WORK/sg_raw.err")"
fi

# --- a byte changed behind the target's back ---------------------------------------------------
printf '\x5a' | dd of="$IMG" bs=1 seek=$((7 * 512 + 100)) conv=notrunc status=none
cmp -s <(dd if="$IMG" bs=512 skip=7 count=1 status=none) \
    <(dd if="$KL_WORK/blocks.bin" bs=512 skip=7 count=1 status=none) &&
    log "(the byte was already 5Ah: the test block is unlucky)"
if dd if="/dev/$dev" of=/dev/null bs=512 skip=7 count=1 iflag=direct status=none 2>"$KL_WORK/dd7.err"; then
    fail "the changed block 7 was read as if nothing happened"
else
    pass "reading the changed block failed: $(head -n 1 "$KL_WORK/dd7.err")"
fi
dmesg | grep -Ei "guard check|protection error" | tail -n 3 | sed 's/^/    kernel: /'
kernel_log_has -i "Logical block guard check failed" &&
    pass "the kernel saw ABORTED COMMAND, LOGICAL BLOCK GUARD CHECK FAILED" ||
    fail "no guard-check sense in the kernel log"
sg_raw -r 512 "/dev/$dev" 28 00 00 00 00 07 00 00 01 00 >/dev/null 2>"$KL_WORK/sg7.err"
grep -i "guard\|info" "$KL_WORK/sg7.err" | sed 's/^/    sg_raw: /'
grep -qi "guard check failed" "$KL_WORK/sg7.err" && grep -Eqi "Info fld=0x0*7\b" "$KL_WORK/sg7.err" &&
    pass "READ(10) of LBA 7: guard check failed, INFORMATION 7" ||
    fail "READ(10) of LBA 7 sense: $(tr '\n' ' ' <"$KL_WORK/sg7.err")"
dd if="/dev/$dev" of=/dev/null bs=512 skip=6 count=1 iflag=direct status=none &&
    dd if="/dev/$dev" of=/dev/null bs=512 skip=8 count=1 iflag=direct status=none &&
    pass "LBAs 6 and 8 still read" || fail "the blocks around 7 failed too"

# --- the tuples outlive the target --------------------------------------------------------------
check "logout" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 --logout
stop_target "$T_PID"
start_target target "$KL_WORK/pi.toml" || { fail "restart blockwire-target"; finish pi; exit 1; }
T_PID=$KL_TPID
login
if dd if="/dev/$dev" of=/dev/null bs=512 skip=7 count=1 iflag=direct status=none 2>/dev/null; then
    fail "after a restart block 7 read"
else
    pass "after a restart block 7 still fails its check"
fi
cmp -s <(dd if="/dev/$dev" bs=512 count=7 iflag=direct status=none) \
    <(head -c $((7 * 512)) "$KL_WORK/blocks.bin") &&
    pass "after a restart LBAs 0-6 read back as written" || fail "LBAs 0-6 after a restart"
dd if="$KL_WORK/blocks.bin" of="/dev/$dev" bs=512 skip=7 seek=7 count=1 oflag=direct status=none
cmp -s <(dd if="/dev/$dev" bs=512 count=16 iflag=direct status=none) "$KL_WORK/blocks.bin" &&
    pass "block 7 rewritten: all 16 blocks read back" || fail "block 7 did not heal"

# --- WRITE(10) with WRPROTECT=1 -------------------------------------------------------------------
# block 9's new data with a tuple: guard, application tag BEEFh, reference tag 9.
dd if=/dev/urandom of="$KL_WORK/new9.bin" bs=512 count=1 status=none
g=$(crc "$KL_WORK/new9.bin" 0)
with_tuple() { # GUARD_HEX: new9.bin followed by the tuple
    cat "$KL_WORK/new9.bin"
    printf "\\x${1:0:2}\\x${1:2:2}\\xbe\\xef\\x00\\x00\\x00\\x09"
}
bad=$(printf %04x $((0x$g ^ 1)))
with_tuple "$bad" >"$KL_WORK/w9bad.bin"
sg_raw -s 520 -i "$KL_WORK/w9bad.bin" "/dev/$dev" 2a 20 00 00 00 09 00 00 01 00 2>"$KL_WORK/w9.err" >/dev/null
grep -qi "guard check failed" "$KL_WORK/w9.err" &&
    cmp -s <(dd if="/dev/$dev" bs=512 skip=9 count=1 iflag=direct status=none) \
        <(dd if="$KL_WORK/blocks.bin" bs=512 skip=9 count=1 status=none) &&
    pass "WRITE(10) WRPROTECT=1 with a wrong guard: refused, block 9 unchanged" ||
    fail "wrong-guard write: $(tr '\n' ' ' <"$KL_WORK/w9.err")"
with_tuple "$g" >"$KL_WORK/w9.bin"
if sg_raw -s 520 -i "$KL_WORK/w9.bin" "/dev/$dev" 2a 20 00 00 00 09 00 00 01 00 >/dev/null 2>"$KL_WORK/w9.err" &&
    read_pi 9 1 "$KL_WORK/r9.bin" && cmp -s "$KL_WORK/w9.bin" "$KL_WORK/r9.bin"; then
    pass "WRITE(10) WRPROTECT=1: block 9 and its tuple ($g beef 00000009) read back as sent"
else
    fail "WRITE(10) WRPROTECT=1 round trip: $(tr '\n' ' ' <"$KL_WORK/w9.err")"
fi

# --- UNMAP: tuples of FFh -----------------------------------------------------------------------
check "blkdiscard of the first MiB" blkdiscard -o 0 -l 1048576 "/dev/$dev"
if read_pi 3 1 "$KL_WORK/r3.bin"; then
    [ "$(tuple "$KL_WORK/r3.bin" 0)" = "ffff ffff ffffffff" ] &&
        [ "$(head -c 512 "$KL_WORK/r3.bin" | tr -d '\0' | wc -c)" = 0 ] &&
        pass "an unmapped block reads zeros with a tuple of FFh" ||
        fail "unmapped block 3: tuple $(tuple "$KL_WORK/r3.bin" 0)"
else
    fail "READ RDPROTECT=1 of an unmapped block: $(cat "$KL_WORK/sg_raw.err")"
fi
dd if="/dev/$dev" of=/dev/null bs=1M count=1 iflag=direct status=none &&
    pass "the unmapped MiB reads through sd" || fail "unmapped MiB read"
kill -0 "$T_PID" && pass "the target serves on" || fail "the target exited"

check "logout" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 --logout
stop_target "$T_PID"
umount "$KL_WORK/pi"
finish pi
