#!/usr/bin/env bash
# interop/kernel/guest-ublk.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# `blockwire ublk` (the initiator library behind the kernel's ublk driver, ublk_drv) serves a
# blockwire-target LUN as /dev/ublkbN: fio crc32c verify through it, mkfs.ext4, files read back
# after a remount, fsck clean, then SIGTERM: the device is deleted and the session logs out.
# Env: KL_OUT (results dir shared with the host), KL_FIO_MIB (fio size, default 256).
. "$(dirname "$0")/lib.sh"

MIB=${KL_FIO_MIB:-256}
PFX=iqn.2026-11.io.blockwire
ip link set lo up
modprobe loop
modprobe ublk_drv || { fail "modprobe ublk_drv"; finish ublk; exit 1; }
[ -c /dev/ublk-control ] && pass "ublk_drv loaded: /dev/ublk-control" || fail "no /dev/ublk-control"

truncate -s $((MIB + 256))M "$KL_WORK/fs.img"
mkfs.ext4 -q -F "$KL_WORK/fs.img"
mkdir -p "$KL_WORK/fs" "$KL_WORK/mnt"
mount -o loop "$KL_WORK/fs.img" "$KL_WORK/fs" || { fail "backing-fs"; finish ublk; exit 1; }
cat >"$KL_WORK/u.toml" <<EOF
[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]
[[target]]
name = "$PFX:lab-ublk"
[[target.lun]]
id = 0
backstore = "file"
path = "$KL_WORK/fs/ublk.img"
size = "$((MIB + 64))M"
EOF
start_target target "$KL_WORK/u.toml" || { fail "start blockwire-target"; finish ublk; exit 1; }
T_PID=$KL_TPID

"$KL_BIN/blockwire" ublk -p 127.0.0.1:3260 -T "$PFX:lab-ublk" -l 0 >"$KL_OUT/ublk.log" 2>&1 &
U_PID=$!
if timeout 240 bash -c 'until grep -q "^ublk device /dev/ublkb" "$1"; do kill -0 "$2" || exit 1; sleep 0.2; done' \
    _ "$KL_OUT/ublk.log" "$U_PID"; then
    dev=$(sed -n 's/^ublk device \(\/dev\/ublkb[0-9]*\).*/\1/p' "$KL_OUT/ublk.log")
    pass "blockwire ublk: $(grep '^ublk device' "$KL_OUT/ublk.log")"
else
    fail "blockwire ublk printed no device: $(tail -n 5 "$KL_OUT/ublk.log" | tr '\n' ' ')"
    finish ublk
    exit 1
fi
timeout 10 bash -c 'until [ -b "$1" ]; do sleep 0.1; done' _ "$dev" || fail "$dev is not a block device"
log "$dev: $(cat /sys/block/${dev#/dev/}/size) sectors, logical block $(cat /sys/block/${dev#/dev/}/queue/logical_block_size)"

if fio_verify "$dev" "${MIB}M" >"$KL_OUT/fio-ublk.log" 2>&1; then
    pass "fio verify through $dev ${MIB}M: $(fio_result "$KL_OUT/fio-ublk.log")"
else
    fail "fio through $dev: $(tail -n 5 "$KL_OUT/fio-ublk.log" | tr '\n' ' ')"
fi

ext4_roundtrip "$dev" "$KL_WORK/mnt"

kill -TERM "$U_PID"
if timeout 60 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.2; done' _ "$U_PID"; then
    wait "$U_PID"
    rc=$?
    [ "$rc" = 0 ] && pass "blockwire ublk stopped cleanly on SIGTERM: $(tail -n 1 "$KL_OUT/ublk.log")" ||
        fail "blockwire ublk exited $rc"
else
    fail "blockwire ublk still running 60 s after SIGTERM"
    kill -KILL "$U_PID"
fi
[ ! -e "$dev" ] && pass "$dev removed" || fail "$dev still exists after stop"
timeout 20 bash -c 'until grep -q "connection closed" "$1"; do sleep 0.2; done' _ "$KL_OUT/target.log" &&
    pass "the target saw the session end" || fail "the target saw no session end"
stop_target "$T_PID"
finish ublk
