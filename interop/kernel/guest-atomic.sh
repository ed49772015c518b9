#!/usr/bin/env bash
# interop/kernel/guest-atomic.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# SBC-4 atomic writes from Linux's sd (6.11+: WRITE ATOMIC(16) for RWF_ATOMIC writes) to
# blockwire file LUNs on ext4, where the target's write-ahead journal makes them
# whole-or-nothing:
#   - sd reads the Block Limits atomic fields: /sys/block/sdX/queue/atomic_write_max_bytes is
#     non-zero on the cached and the direct file LUN, 0 on a LUN with atomic_writes = false;
#     REPORT SUPPORTED OPERATION CODES lists WRITE ATOMIC(16) only where it is offered;
#   - pwritev2(RWF_ATOMIC) with O_DIRECT through /dev/sdX lands (read back), reaches the target
#     as WRITE ATOMIC(16) (the kernel's scsi_dispatch_cmd_start trace), and is refused by the
#     kernel on the LUN without atomic writes;
#   - torn-write test: four writers stream 16 KiB RWF_ATOMIC writes of (unit, generation)
#     stamps over 64 units; blockwire-target is killed with SIGKILL mid-stream, five times,
#     and restarted on the same file each time (the journal replays what was unfinished); the
#     kernel logs in again and the writers go on. Afterwards every unit is checked, through
#     /dev/sdX and in the backing file itself: each holds one whole stamp, of the generation
#     last acknowledged to its writer (or the one attempted after it).
#   - a block device whose kernel offers untorn writes (scsi_debug with atomic_wr=1, itself a
#     SCSI disk with WRITE ATOMIC(16)) served without a journal: statx's atomic write units of
#     the device, the one size LUN 3 offers (atomic_unit, 16 KiB by default) as sd sees it
#     (unit_min = unit_max), a 16 KiB RWF_ATOMIC write through the iSCSI disk reaching the
#     scsi_debug disk as WRITE ATOMIC(16) (the SCSI trace, per host) and reading back the
#     same from both, an 8 KiB one refused by the initiator's kernel, and a WRITE ATOMIC(16)
#     at an LBA off the alignment refused by blockwire with INVALID FIELD IN CDB (sg_raw).
# Env: KL_OUT (results dir shared with the host).
. "$(dirname "$0")/lib.sh"

PFX=iqn.2026-11.io.blockwire
IQN=$PFX:lab-atomic
IO="python3 $(dirname "$0")/atomic_io.py"
UNITS=64 WRITERS=4 ROUNDS=5
lab_up || { fail "lab-up"; finish atomic; exit 1; }

# The backing files live on ext4 (a loop device), as on a real server.
truncate -s 512M "$KL_WORK/fs.img"
mkfs.ext4 -q -F "$KL_WORK/fs.img"
mkdir -p "$KL_WORK/fs"
mount -o loop "$KL_WORK/fs.img" "$KL_WORK/fs" || { fail "backing ext4"; finish atomic; exit 1; }
# A disk whose kernel makes atomic writes untorn: scsi_debug's RAM disk with WRITE ATOMIC(16).
modprobe sd_mod
modprobe scsi_debug dev_size_mb=64 atomic_wr=1 || { fail "modprobe scsi_debug atomic_wr=1"; finish atomic; exit 1; }
sdebug=""
for i in $(seq 1 100); do
    for d in /sys/block/sd*; do
        [ -e "$d/device/model" ] && grep -q scsi_debug "$d/device/model" && sdebug=${d##*/}
    done
    [ -n "$sdebug" ] && break
    sleep 0.1
done
[ -n "$sdebug" ] || { fail "no scsi_debug disk appeared"; finish atomic; exit 1; }
sdebug_host=$(basename "$(readlink -f "/sys/block/$sdebug/device")" | cut -d: -f1)
log "scsi_debug disk /dev/$sdebug (host $sdebug_host): atomic_write_unit_min_bytes=$(cat /sys/block/$sdebug/queue/atomic_write_unit_min_bytes) unit_max=$(cat /sys/block/$sdebug/queue/atomic_write_unit_max_bytes)"
cat >"$KL_WORK/a.toml" <<EOF
[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]
[[target]]
name = "$IQN"
[[target.lun]]
id = 0
backstore = "file"
path = "$KL_WORK/fs/cached.img"
size = "64M"
[[target.lun]]
id = 1
backstore = "file"
mode = "direct"
path = "$KL_WORK/fs/direct.img"
size = "64M"
[[target.lun]]
id = 2
backstore = "file"
path = "$KL_WORK/fs/plain.img"
size = "64M"
atomic_writes = false
[[target.lun]]
id = 3
backstore = "file"
mode = "direct"
path = "/dev/$sdebug"
EOF
start_target target "$KL_WORK/a.toml" || { fail "start blockwire-target"; finish atomic; exit 1; }
T_PID=$KL_TPID
[ -s "$KL_WORK/fs/cached.img.atomic-journal" ] && [ ! -e "$KL_WORK/fs/plain.img.atomic-journal" ] &&
    pass "journals: $(cd "$KL_WORK/fs" && ls *.atomic-journal | tr '\n' ' ')(none for atomic_writes = false)" ||
    fail "journal files: $(ls "$KL_WORK/fs")"

iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3260 >/dev/null
for kv in node.session.timeo.replacement_timeout=120 'node.conn[0].timeo.noop_out_interval=2' \
    'node.conn[0].timeo.noop_out_timeout=5'; do
    iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 -o update -n "${kv%%=*}" -v "${kv#*=}" >/dev/null
done
check "login" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 --login
sid=$(session_id "$IQN")
cached=$(lun_dev "$sid" 0) && direct=$(lun_dev "$sid" 1) && plain=$(lun_dev "$sid" 2) &&
    device=$(lun_dev "$sid" 3) ||
    { fail "LUN disks did not appear"; finish atomic; exit 1; }
log "LUN 0 (cached) /dev/$cached, LUN 1 (direct) /dev/$direct, LUN 2 (atomic_writes = false) /dev/$plain, LUN 3 (/dev/$sdebug, no journal) /dev/$device"
grep -m 1 "WRITE ATOMIC(16): atomic writes of" "$KL_OUT/target.log" | sed 's/^.*INFO/    target: INFO/'

# --- what sd made of the Block Limits page -------------------------------------------------------
q() { cat "/sys/block/$1/queue/$2" 2>/dev/null || echo missing; }
for d in "$cached" "$direct" "$plain" "$device"; do
    log "$d: atomic_write_max_bytes=$(q "$d" atomic_write_max_bytes) unit_min=$(q "$d" atomic_write_unit_min_bytes) unit_max=$(q "$d" atomic_write_unit_max_bytes) boundary=$(q "$d" atomic_write_boundary_bytes)"
done
sg_vpd -p bl "/dev/$cached" 2>&1 | grep -i atomic | sed 's/^/    sg_vpd LUN 0: /'
for d in "$cached" "$direct"; do
    m=$(q "$d" atomic_write_max_bytes) u=$(q "$d" atomic_write_unit_max_bytes)
    if [ "$m" != missing ] && [ "$m" -gt 0 ] && [ "$u" -ge 16384 ]; then
        pass "sd: /dev/$d atomic_write_max_bytes=$m atomic_write_unit_max_bytes=$u"
    else
        fail "sd: /dev/$d atomic_write_max_bytes=$m atomic_write_unit_max_bytes=$u"
    fi
done
# LUN 3 offers one size, the kernel's untorn writes of 16 KiB: sd makes it the unit's only size.
sg_vpd -p bl "/dev/$device" 2>&1 | grep -i atomic | sed 's/^/    sg_vpd LUN 3: /'
u_min=$(q "$device" atomic_write_unit_min_bytes) u_max=$(q "$device" atomic_write_unit_max_bytes)
[ "$u_min" = 16384 ] && [ "$u_max" = 16384 ] &&
    pass "sd: /dev/$device (block device, untorn writes by the kernel) atomic_write_unit_min_bytes=$u_min unit_max=$u_max" ||
    fail "sd: /dev/$device atomic_write_unit_min_bytes=$u_min unit_max=$u_max, want 16384 and 16384"
[ "$(q "$plain" atomic_write_max_bytes)" = 0 ] &&
    pass "sd: /dev/$plain (atomic_writes = false) atomic_write_max_bytes=0" ||
    fail "sd: /dev/$plain atomic_write_max_bytes=$(q "$plain" atomic_write_max_bytes), want 0"
# SUPPORT (byte 1, bits 2:0) of REPORT SUPPORTED OPERATION CODES for 9Ch alone: 3 supported
# as the standard says, 1 not supported.
support() { sg_opcodes -n -o 0x9c --raw "/dev/$1" 2>/dev/null | od -An -tu1 -j1 -N1 | awk '{print $1 % 8}'; }
s0=$(support "$cached") s2=$(support "$plain")
log "sg_opcodes 9Ch: $(sg_opcodes -n -o 0x9c "/dev/$cached" 2>&1 | head -n 3 | tr -s ' \n' ' ')"
[ "$s0" = 3 ] && [ "$s2" = 1 ] &&
    pass "REPORT SUPPORTED OPERATION CODES: 9Ch SUPPORT=$s0 on LUN 0, $s2 (not supported) on LUN 2" ||
    fail "REPORT SUPPORTED OPERATION CODES: 9Ch SUPPORT=$s0 on LUN 0, $s2 on LUN 2 (want 3 and 1)"

# --- pwritev2(RWF_ATOMIC) through /dev/sdX ------------------------------------------------------
tr=/sys/kernel/tracing
mountpoint -q $tr || mount -t tracefs nodev $tr
echo 0 >$tr/tracing_on
echo >$tr/trace
echo 1 >$tr/events/scsi/scsi_dispatch_cmd_start/enable
echo 1 >$tr/tracing_on
for d in "$cached" "$direct" "$device"; do
    out=$($IO once "/dev/$d" 65536 16384) && pass "/dev/$d: $out" || fail "/dev/$d: $out"
done
echo 0 >$tr/tracing_on
iscsi_host=$(basename "$(readlink -f "/sys/block/$cached/device")" | cut -d: -f1)
n9c=$(grep "WRITE_ATOMIC_16\|opcode=0x9c" $tr/trace | grep -c "host_no=$iscsi_host " || true)
n9c_debug=$(grep "WRITE_ATOMIC_16\|opcode=0x9c" $tr/trace | grep -c "host_no=$sdebug_host " || true)
grep -m 2 "WRITE_ATOMIC_16\|opcode=0x9c" $tr/trace | sed 's/^ */    trace: /'
grep "WRITE_ATOMIC_16\|opcode=0x9c" $tr/trace | grep -m 1 "host_no=$sdebug_host " | sed 's/^ */    trace: /'
[ "$n9c" -ge 3 ] && pass "the kernel sent WRITE ATOMIC(16) for them to blockwire ($n9c in the SCSI trace, host $iscsi_host)" ||
    fail "WRITE ATOMIC(16) to blockwire: $n9c in the SCSI trace, want 3 ($(grep -c scsi_dispatch_cmd_start $tr/trace) commands traced)"
# LUN 3's write left blockwire as pwritev2(RWF_ATOMIC), which the kernel sent to the disk below
# as WRITE ATOMIC(16): no journal, the device keeps the promise.
[ "$n9c_debug" -ge 1 ] && pass "blockwire's RWF_ATOMIC write reached /dev/$sdebug as WRITE ATOMIC(16) ($n9c_debug in the SCSI trace, host $sdebug_host)" ||
    fail "no WRITE ATOMIC(16) to /dev/$sdebug (host $sdebug_host) in the SCSI trace"
a=$(dd if="/dev/$device" bs=16384 skip=4 count=1 iflag=direct 2>/dev/null | sha256sum)
b=$(dd if="/dev/$sdebug" bs=16384 skip=4 count=1 iflag=direct 2>/dev/null | sha256sum)
[ "$a" = "$b" ] && pass "the 16 KiB read back through blockwire equals /dev/$sdebug's (${a%% *})" ||
    fail "through blockwire ${a%% *}, on /dev/$sdebug ${b%% *}"
out=$($IO once "/dev/$device" 65536 8192)
[ $? = 2 ] && pass "/dev/$device: 8 KiB is not its atomic size, the kernel refuses: $out" || fail "/dev/$device 8 KiB: $out"
# A WRITE ATOMIC(16) of 32 blocks at LBA 8 (alignment 32): ILLEGAL REQUEST, INVALID FIELD IN CDB.
head -c 16384 /dev/zero >"$KL_WORK/zeros16k"
out=$(sg_raw -s 16384 -i "$KL_WORK/zeros16k" "/dev/$device" 9c 00 00 00 00 00 00 00 00 08 00 00 00 20 00 00 2>&1)
echo "$out" | grep -qi "invalid field in cdb" &&
    pass "WRITE ATOMIC(16) at LBA 8 of /dev/$device: $(echo "$out" | grep -i -m 1 "invalid field" | tr -s ' ')" ||
    fail "WRITE ATOMIC(16) at LBA 8 of /dev/$device: $(echo "$out" | tail -n 3 | tr '\n' ' ')"
# The event stays enabled (tracing_on 0 already stops the recording): turning a tracepoint off
# patches kernel text while I/O may be in flight, and twice in one CI run a guest on a software-
# emulated CPU vanished (QEMU gone, exit 255) between the PASS above and the next line.
out=$($IO once "/dev/$plain" 65536 16384)
[ $? = 2 ] && pass "/dev/$plain (no atomic writes): the kernel refuses: $out" || fail "/dev/$plain: $out"

# --- torn-write test: SIGKILL of the target during a stream of atomic writes --------------------
dev=/dev/$cached
start_writers() {
    W_PIDS=()
    for i in $(seq 0 $((WRITERS - 1))); do
        $IO writer "$dev" $UNITS $WRITERS "$i" "$KL_WORK/acked.$i.json" &
        W_PIDS+=($!)
    done
}
rm -f "$KL_WORK"/acked.*.json
start_writers
replays=0
for round in $(seq 1 $ROUNDS); do
    wait_written "$cached" $((UNITS * 32 * 2)) 240 || log "round $round: little written in 240 s"
    sleep 3
    kill -KILL "$T_PID"
    wait "$T_PID" 2>/dev/null
    log "round $round: blockwire-target killed (SIGKILL) under $WRITERS writers; journal: $(
        python3 - "$KL_WORK/fs/cached.img.atomic-journal" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
slots, size = struct.unpack(">II", d[8:16])
stride = (64 + size + 4095) // 4096 * 4096
st = [d[4096 + i * stride + 32] if len(d) > 4096 + i * stride + 32 else 0 for i in range(slots)]
print(f"{sum(1 for s in st if s == 1)} slot(s) marked pending (whole or torn), {sum(1 for s in st if s == 2)} done")
PY
    )"
    sleep 2
    start_target target "$KL_WORK/a.toml" || { fail "restart blockwire-target (round $round)"; break; }
    T_PID=$KL_TPID
    r=$(grep -c "replayed atomic writes a crash left unfinished" "$KL_OUT/target.log" || true)
    log "round $round: target restarted; replays logged so far: $r"
    replays=$r
done
wait_written "$cached" $((UNITS * 32)) 240 || log "little written after the last restart"
sleep 3
kill -TERM "${W_PIDS[@]}"
for p in "${W_PIDS[@]}"; do
    bounded 180 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.2; done' _ "$p" || kill -KILL "$p"
done
wait "${W_PIDS[@]}"
ls "$KL_WORK"/acked.*.json >/dev/null 2>&1 || { fail "writers left no record"; finish atomic; exit 1; }
grep -h "replayed" "$KL_OUT/target.log" | sed 's/^/    target: /' | head -n 5
if out=$($IO check "$dev" $UNITS "$KL_WORK"/acked.*.json); then
    pass "after $ROUNDS SIGKILLs: every unit through $dev wholly one generation: $(echo "$out" | tail -n 1)"
else
    fail "torn or lost atomic writes through $dev: $(echo "$out" | tail -n 6 | tr '\n' ' ')"
fi
# The backing file itself, with the target stopped.
check "logout" iscsiadm -m node -T "$IQN" -p 127.0.0.1:3260 --logout
stop_target "$T_PID"
# O_DIRECT reads work on the ext4 file as on the disk.
if out=$($IO check "$KL_WORK/fs/cached.img" $UNITS "$KL_WORK"/acked.*.json); then
    pass "backing file after stop: every unit wholly one generation: $(echo "$out" | tail -n 1)"
else
    fail "backing file: $(echo "$out" | tail -n 6 | tr '\n' ' ')"
fi
log "replays of unfinished atomic writes over $ROUNDS restarts: $replays restart(s) replayed records"
umount "$KL_WORK/fs"
finish atomic
