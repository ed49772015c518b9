#!/bin/bash
# interop/test-initiator-fuse.sh — a LUN as a block device through `blockwire mount`, end to end:
#
#   blockwire-target (1 GiB RAM LUN 0) on a free port
#   blockwire mount -p 127.0.0.1:PORT MNT          LUN 0 appears as MNT/lun0 (1 GiB)
#   losetup --direct-io=on MNT/lun0                 (plain losetup when direct I/O is refused)
#   mkfs.ext4, mount, write files of random data, record their SHA-256, unmount
#   fsck.ext4 -f -n                                 must be clean
#   mount again, check the SHA-256s, unmount, losetup -d
#   stop `blockwire mount` with SIGTERM             (it unmounts, SYNCHRONIZE CACHE, logout)
#   a second `blockwire mount` (a new session): losetup, fsck.ext4 -f -n, mount, same SHA-256s
#     (the data lives on the target, not in a cache of the first mount)
#   then the same path (mount, losetup, mkfs.ext4, files, fsck, read-back) against tgtd's LUN 1
#     when tgtd is installed
#
#   (with fio) random 4 KiB writes at iodepth 32 and unaligned 1000-byte writes at iodepth 16
#   through MNT/lun0, each verified with crc32c
#
# Prints each step; exits 1 on the first failure. Cleans up (file systems, loop devices,
# FUSE mounts, processes it started — by PID) in a trap, even on failure or timeout.
# Needs root, /dev/fuse, fuse3 (fusermount3), util-linux (losetup), e2fsprogs, fio and tgt
# (tgtd, tgtadm). A missing one is a FAIL (exit 1), never a skip: a test that cannot run its
# peer fails. Bounded: the whole script re-executes itself under `timeout` (BW_FUSE_TIMEOUT
# seconds, default 300).
set -euo pipefail
if [ -z "${_BW_FUSE_TIMED:-}" ]; then
    export _BW_FUSE_TIMED=1
    exec timeout -k 60 "${BW_FUSE_TIMEOUT:-300}" "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib/blockwire.sh"

IQN=iqn.2026-11.io.blockwire:default

step() { printf '==== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }

[ "$(id -u)" = 0 ] || fail "test-initiator-fuse needs root (losetup, mount)"
[ -c /dev/fuse ] || fail "/dev/fuse is missing (no FUSE in this kernel/container): the FUSE export cannot be tested"
for tool in losetup mkfs.ext4 fsck.ext4 sha256sum fio tgtd tgtadm; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (.ci/run installs it)"
done
command -v fusermount3 >/dev/null || echo "note: fusermount3 missing; mounting with mount(2) as root"

bw=$(blockwire_cli) || fail "release build of the blockwire CLI failed"

tmp=$(mktemp -d /tmp/bw-fuse.XXXXXX)
mnt=$tmp/luns
fsdir=$tmp/fs
mkdir -p "$mnt" "$fsdir" "$tmp/data"
target_pid="" mount_pid="" loopdev="" tgt_pid="" tgt_port=""

stop_mount() {
    # SIGTERM: blockwire mount unmounts, flushes and logs out; wait (bounded) for it.
    local pid=$1 rc=0
    kill -TERM "$pid" 2>/dev/null || return 0
    if ! timeout 25 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.1; done' _ "$pid"; then
        echo "blockwire mount $pid still running 25 s after SIGTERM: lazy unmount + SIGKILL"
        fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || rc=$?
    return "$rc"
}

# detach_loop — losetup -d, then wait (bounded) until no loop device holds the LUN file: the
# kernel may release it a moment later (autoclear while something still has it open).
detach_loop() {
    step "losetup -d $loopdev"
    losetup -d "$loopdev" || fail "losetup -d"
    loopdev=""
    timeout 10 bash -c 'while [ -n "$(losetup -j "$1")" ]; do sleep 0.1; done' _ "$mnt/$cur_file" ||
        fail "a loop device still holds $mnt/$cur_file"
}

cleanup() {
    set +e
    mountpoint -q "$fsdir" && { umount "$fsdir" || umount -l "$fsdir"; }
    [ -n "$loopdev" ] && losetup -d "$loopdev" 2>/dev/null
    [ -n "$mount_pid" ] && stop_mount "$mount_pid" >/dev/null 2>&1
    mountpoint -q "$mnt" && { fusermount3 -u -z "$mnt" 2>/dev/null || umount -l "$mnt"; }
    [ -n "$target_pid" ] && stop_blockwire "$target_pid" 2>/dev/null
    [ -n "$tgt_pid" ] && stop_tgtd "$tgt_port" "$tgt_pid"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 1' INT TERM

start_mount() {
    step "blockwire mount -p $cur_portal -T $cur_iqn $mnt  ($1)"
    "$bw" mount -p "$cur_portal" -T "$cur_iqn" "$mnt" >"$tmp/mount-$1.log" 2>&1 </dev/null &
    mount_pid=$!
    if ! timeout 20 bash -c 'until [ -e "$1" ]; do kill -0 "$2" 2>/dev/null || exit 1; sleep 0.1; done' \
            _ "$mnt/$cur_file" "$mount_pid"; then
        cat "$tmp/mount-$1.log"
        fail "the FUSE mount did not show $cur_file"
    fi
    sed 's/^/    /' "$tmp/mount-$1.log"
    local size
    size=$(stat -c %s "$mnt/$cur_file")
    echo "    $mnt/$cur_file: $size bytes"
    [ "$size" = "$cur_size" ] || fail "$cur_file is $size bytes, the LUN has $cur_size"
}

attach_loop() {
    if loopdev=$(losetup -f --show --direct-io=on "$mnt/$cur_file" 2>"$tmp/losetup.err"); then
        step "losetup --direct-io=on $mnt/$cur_file -> $loopdev"
    else
        echo "    losetup --direct-io=on refused: $(cat "$tmp/losetup.err"); plain losetup"
        loopdev=$(losetup -f --show "$mnt/$cur_file") || fail "losetup"
        step "losetup $mnt/$cur_file -> $loopdev"
    fi
    losetup -l "$loopdev" | sed 's/^/    /'
}

run_fsck() {
    step "fsck.ext4 -f -n $loopdev"
    local rc=0
    timeout 120 fsck.ext4 -f -n "$loopdev" >"$tmp/fsck.log" 2>&1 || rc=$?
    sed 's/^/    /' "$tmp/fsck.log"
    [ "$rc" = 0 ] || fail "fsck.ext4 exited $rc"
    echo "    fsck.ext4 exit 0: clean"
}

verify() {
    step "read back and compare SHA-256 ($1)"
    local rc=0
    (cd "$fsdir" && sha256sum -c "$tmp/sums") >"$tmp/check.log" 2>&1 || rc=$?
    sed 's/^/    /' "$tmp/check.log" | head -n 3
    echo "    ..."
    [ "$rc" = 0 ] || { grep -v ': OK$' "$tmp/check.log"; fail "checksums differ ($1)"; }
    echo "    $(grep -c ': OK$' "$tmp/check.log")/$(wc -l <"$tmp/sums") files identical"
}

stop_and_report() {
    step "stop blockwire mount (SIGTERM: unmount, SYNCHRONIZE CACHE, logout)"
    local rc=0
    stop_mount "$mount_pid" || rc=$?
    mount_pid=""
    sed 's/^/    /' "$tmp/mount-$1.log"
    [ "$rc" = 0 ] || fail "blockwire mount exited $rc"
    grep -q "logged out" "$tmp/mount-$1.log" || fail "blockwire mount did not log out"
    ! mountpoint -q "$mnt" || fail "$mnt is still mounted"
}

port=$(free_port)
step "start blockwire-target on 127.0.0.1:$port"
target_pid=$(start_blockwire "$port" "$tmp") || fail "blockwire-target did not start"
cur_portal=127.0.0.1:$port cur_iqn=$IQN cur_file=lun0 cur_size=$((1 << 30))

start_mount first

step "raw O_DIRECT|O_DSYNC write to $mnt/lun0 (FUA) and read-back"
head -c 65536 /dev/urandom >"$tmp/data/raw.bin"
dd if="$tmp/data/raw.bin" of="$mnt/lun0" bs=64k seek=100 conv=notrunc oflag=direct,dsync status=none ||
    fail "dd to lun0"
dd if="$mnt/lun0" of="$tmp/data/raw.back" bs=64k skip=100 count=1 iflag=direct status=none ||
    fail "dd from lun0"
cmp "$tmp/data/raw.bin" "$tmp/data/raw.back" || fail "raw read-back differs"
echo "    64 KiB at offset 6400 KiB: $(sha256sum <"$tmp/data/raw.back" | cut -c1-16)... identical"
if command -v fio >/dev/null; then
    # Many commands in flight through the file: 4 KiB random writes at iodepth 32, and
    # 1000-byte (unaligned: read-modify-write) random writes at iodepth 16, each verified.
    for spec in "4k 32 64M" "1000 16 128M"; do
        read -r bs depth offset <<<"$spec"
        step "fio: random writes bs=$bs iodepth=$depth O_DIRECT + crc32c verify on $mnt/lun0"
        timeout 120 fio --name=bw-fuse --filename="$mnt/lun0" --direct=1 --ioengine=libaio \
            --iodepth="$depth" --rw=randwrite --bs="$bs" --offset="$offset" --size=4M \
            --verify=crc32c --do_verify=1 --output="$tmp/fio.log" || { cat "$tmp/fio.log"; fail "fio"; }
        grep -E "err=|IOPS" "$tmp/fio.log" | sed 's/^ */    /'
        grep -q "err= 0" "$tmp/fio.log" || fail "fio reported errors"
    done
else
    fail "fio is not installed: concurrent-write verification cannot run"
fi
attach_loop

step "mkfs.ext4 $loopdev"
timeout 120 mkfs.ext4 -q -F -L bwfuse "$loopdev" || fail "mkfs.ext4"
step "mount $loopdev $fsdir"
timeout 60 mount -t ext4 "$loopdev" "$fsdir" || fail "mount ext4"

step "write files of random data"
mkdir -p "$fsdir/dir/sub"
head -c $((5 << 20)) /dev/urandom >"$fsdir/random-5M.bin"
head -c $((3 << 20)) /dev/urandom >"$fsdir/dir/random-3M.bin"
head -c 4097 /dev/urandom >"$fsdir/dir/sub/odd-4097.bin"
for i in $(seq 1 20); do head -c $((i * 1000)) /dev/urandom >"$fsdir/dir/small-$i.bin"; done
# A file written O_DIRECT|O_SYNC through the file system (FUA where the stack passes it).
dd if=/dev/urandom of="$fsdir/direct-sync-1M.bin" bs=64k count=16 oflag=direct,sync status=none
(cd "$fsdir" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$tmp/sums"
sed 's/^/    /' "$tmp/sums" | head -n 5
echo "    ... $(wc -l <"$tmp/sums") files, $(du -sh "$fsdir" | cut -f1) in all"
sync

step "umount $fsdir"
timeout 60 umount "$fsdir" || fail "umount"
run_fsck

step "mount $loopdev $fsdir again"
timeout 60 mount -t ext4 "$loopdev" "$fsdir" || fail "mount ext4 (second)"
verify "same session"
step "umount $fsdir"
timeout 60 umount "$fsdir" || fail "umount (second)"
detach_loop
stop_and_report first
grep -Eq "synchronize_cache=[1-9]" "$tmp/mount-first.log" ||
    fail "no fsync reached the LUN as SYNCHRONIZE CACHE"
grep -Eq "[1-9][0-9]* with FUA" "$tmp/mount-first.log" || fail "the O_DSYNC write carried no FUA"

start_mount second
attach_loop
run_fsck
step "mount $loopdev $fsdir (new session)"
timeout 60 mount -t ext4 -o ro "$loopdev" "$fsdir" || fail "mount ext4 (new session)"
verify "new session"
step "umount $fsdir"
timeout 60 umount "$fsdir" || fail "umount (new session)"
detach_loop
stop_and_report second

step "stop blockwire-target"
rc=0
stop_blockwire "$target_pid" || rc=$?
target_pid=""
[ "$rc" = 0 ] || fail "blockwire-target exited $rc"
# The same path against a third-party target: tgtd's LUN 1 (its LUN 0 is a controller,
# which blockwire mount leaves out).
if command -v tgtd >/dev/null; then
    tgt_port=$(free_port)
    step "start tgtd on 127.0.0.1:$tgt_port with a 256 MiB LUN 1"
    tgt_pid=$(start_tgtd "$tgt_port" "$tmp") || fail "tgtd did not start"
    tgtd_new_target "$tgt_port" 1 iqn.2026-11.io.tgtd:fuse || fail "tgtadm target"
    tgtd_add_lun "$tgt_port" 1 1 "$tmp/tgtd-lun.img" 256 || fail "tgtadm lun"
    cur_portal=127.0.0.1:$tgt_port cur_iqn=iqn.2026-11.io.tgtd:fuse cur_file=lun1
    cur_size=$((256 << 20))
    start_mount tgtd
    [ ! -e "$mnt/lun0" ] || fail "tgtd's controller LUN 0 was exposed"
    attach_loop
    step "mkfs.ext4 $loopdev; mount; write files; umount"
    timeout 120 mkfs.ext4 -q -F "$loopdev" || fail "mkfs.ext4 (tgtd)"
    timeout 60 mount -t ext4 "$loopdev" "$fsdir" || fail "mount ext4 (tgtd)"
    head -c $((4 << 20)) /dev/urandom >"$fsdir/random-4M.bin"
    for i in $(seq 1 10); do head -c $((i * 3000)) /dev/urandom >"$fsdir/small-$i.bin"; done
    (cd "$fsdir" && find . -type f -print0 | sort -z | xargs -0 sha256sum) >"$tmp/sums"
    echo "    $(wc -l <"$tmp/sums") files"
    timeout 60 umount "$fsdir" || fail "umount (tgtd)"
    run_fsck
    timeout 60 mount -t ext4 "$loopdev" "$fsdir" || fail "mount ext4 (tgtd, second)"
    verify "tgtd"
    timeout 60 umount "$fsdir" || fail "umount (tgtd, second)"
    detach_loop
    stop_and_report tgtd
    step "stop tgtd"
    stop_tgtd "$tgt_port" "$tgt_pid"
    tgt_pid=""
else
    fail "tgtd is not installed: the tgtd round cannot run"
fi
echo "PASS: test-initiator-fuse"
