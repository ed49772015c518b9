#!/usr/bin/env bash
# interop/kernel/guest-rdma.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# The verbs backend on real verbs: Soft-RoCE (rdma_rxe) over a veth pair, driven through
# libibverbs and librdmacm by the same conformance suite the soft provider passes in
# `cargo test` (transport/src/rdma/conformance.rs): RDMA CM connect/accept/reject with private
# data, RDMA Write/Read with SGE lists, Send/Recv, remote access errors (forged and stale keys,
# out-of-bounds ranges, missing permission) leaving both sides' memory untouched, rkey
# invalidation and deregistration, local protection errors, and disconnect flushing receives.
# The soft provider runs the suite here too, as the baseline. Then RDMA-assisted iSCSI on
# verbs end to end (tests/examples/rdma_assisted_check.rs): a target whose offload listener
# runs on rxe0, blockwire's initiator moving 32 MiB by RDMA Read/Write and reading it back,
# both sides' counters, and plain-iSCSI fallback for an initiator asking another backend.
# Last, standard iSER (RFC 7145): Linux's own iSER initiator (ib_iser, iscsiadm -I iser)
# logs in to blockwire-target's iSER portal on rxe0 (`iser = true` on its portal group,
# `rdma_backend = "verbs"`), with CRC32C digests offered and answered None as RFC 7145
# requires, and runs dd and fio crc32c verify through the disk, mkfs.ext4, fsck and
# read-back; then logs out and in again and finds the same data. blockwire's own iSER
# initiator (tests/examples/iser_check.rs, verbs on rxe0) then runs its checks against
# that portal and against LIO's iSER target (ib_isert, interop/kernel/lio_iser.py).
# Env: KL_OUT (results dir shared with the host).
. "$(dirname "$0")/lib.sh"

RUNNER=$KL_BIN/examples/rdma_conformance
ASSISTED=$KL_BIN/examples/rdma_assisted_check
ISER_CHECK=$KL_BIN/examples/iser_check
IQN=iqn.2026-11.io.blockwire:iser
ip link set lo up
[ -x "$RUNNER" ] || { fail "no $RUNNER (cargo build --release -p blockwire-transport --features verbs --example rdma_conformance)"; finish rdma; exit 1; }

if modprobe rdma_rxe; then pass "modprobe rdma_rxe"; else fail "modprobe rdma_rxe"; finish rdma; exit 1; fi
# One veth pair: rxe0 on veth0 carries both ends of every connection (rxe loops traffic
# between QPs of one device back internally).
ip link add veth0 type veth peer name veth1
ip link set veth0 up
ip link set veth1 up
ip addr add 10.77.0.1/24 dev veth0
if rdma link add rxe0 type rxe netdev veth0; then
    pass "rdma link add rxe0 (veth0, 10.77.0.1)"
else
    fail "rdma link add rxe0"
    finish rdma
    exit 1
fi
log "$(rdma link show 2>&1 | tr '\n' ' ')"
log "ibv_devices: $(ibv_devices 2>&1 | tail -n +3 | tr '\n' ' ')"
# Wait until the port is ACTIVE (GIDs appear once the netdev has its address).
timeout 20 bash -c 'until rdma link show rxe0/1 2>/dev/null | grep -q "state ACTIVE"; do sleep 0.2; done' &&
    pass "rxe0 port ACTIVE" || fail "rxe0 port not ACTIVE: $(rdma link show 2>&1 | tr '\n' ' ')"

# run_suite NAME SUMMARY-PREFIX CMD...: every PASS/FAIL line CMD prints becomes a check.
run_suite() {
    local name=$1 summary=$2
    shift 2
    local out="$KL_OUT/$name.log"
    if timeout 300 "$@" >"$out" 2>&1; then :; fi
    # Every line of the runner becomes a check of this suite.
    while IFS= read -r line; do
        case $line in
            PASS\ *) pass "${line#PASS }" ;;
            FAIL\ *) fail "${line#FAIL }" ;;
            *) log "$line" ;;
        esac
    done <"$out"
    grep -q "^$summary: [0-9]* passed, 0 failed" "$out" ||
        fail "$name did not finish cleanly: $(tail -n 3 "$out" | tr '\n' ' ')"
}

run_suite conformance-soft soft "$RUNNER" soft 127.0.0.1
run_suite conformance-verbs verbs "$RUNNER" verbs 10.77.0.1 rxe0
[ -x "$ASSISTED" ] || fail "no $ASSISTED (cargo build --release -p blockwire-tests --features blockwire-transport/verbs --example rdma_assisted_check)"
run_suite assisted-verbs "rdma-assisted verbs" "$ASSISTED" verbs 10.77.0.1 rxe0
# The registration strategies on real verbs memory regions (function: data checked,
# registrations balanced; the emulated CPU's timings are no measurement).
run_suite registration-verbs reg-fig8 "$KL_BIN/examples/reg_fig8" --backend verbs --addr 10.77.0.1 --device rxe0

# ---- standard iSER with the kernel's initiator ----
iser_suite() {
    modprobe ib_iser && pass "modprobe ib_iser" || { fail "modprobe ib_iser"; return; }
    lab_up || { fail "iscsid"; return; }
    # rdma_listen: the same target also grants RDMA-assisted iSCSI on its TCP portal (for
    # the kernel host's RDMA-assisted session below).
    cat >"$KL_WORK/iser.toml" <<EOF
[fabric]
rdma_backend = "verbs"
rdma_device = "rxe0"
rdma_listen = "10.77.0.1:0"

[[portal_group]]
tag = 1
listen = ["10.77.0.1:3260"]
iser = true

[[target]]
name = "$IQN"

[[target.lun]]
id = 0
backstore = "ram"
size = "512M"
EOF
    "$KL_BIN/blockwire-target" --config "$KL_WORK/iser.toml" >"$KL_OUT/iser-target.log" 2>&1 </dev/null &
    ISER_PID=$!
    timeout 60 bash -c 'until grep -q "iSER portal (RFC 7145) listening" "$1"; do
            kill -0 "$2" 2>/dev/null || exit 1; sleep 0.2; done' _ "$KL_OUT/iser-target.log" "$ISER_PID" ||
        { fail "blockwire-target with an iSER portal did not start: $(tail -n 3 "$KL_OUT/iser-target.log" | tr '\n' ' ')"; return; }
    pass "blockwire-target iSER portal from the config file: $(grep -o 'iSER portal.*' "$KL_OUT/iser-target.log" | head -n 1)"
    out=$(iscsiadm -m discovery -t sendtargets -p 10.77.0.1:3260 -I iser 2>&1)
    grep -q "$IQN" <<<"$out" && pass "discovery over iSER: $out" || { fail "discovery: $out"; return; }
    # Offer digests: RFC 7145 says an iSER connection has none, so the target answers None.
    for key in HeaderDigest DataDigest; do
        iscsiadm -m node -T "$IQN" -p 10.77.0.1:3260 -I iser -o update \
            -n "node.conn[0].iscsi.$key" -v CRC32C,None >/dev/null 2>&1 ||
            fail "iscsiadm -o update $key"
    done
    out=$(timeout 120 iscsiadm -m node -T "$IQN" -p 10.77.0.1:3260 -I iser --login 2>&1) &&
        pass "login over iSER (iscsiadm -I iser)" || { fail "iSER login: $out"; return; }
    sid=$(session_id "$IQN" iser)
    transport=$(iscsiadm -m session -r "$sid" -P 1 2>/dev/null | awk '/Iface Transport/{print $3}')
    [ "$transport" = iser ] && pass "session $sid runs on the iser transport" ||
        fail "session $sid transport: '$transport'"
    digests=$(iscsiadm -m session -r "$sid" -P 2 2>/dev/null | grep -E '^\s*(HeaderDigest|DataDigest):' | tr -s ' \t\n' ' ')
    [ "$(grep -o 'Digest: None' <<<"$digests" | wc -l)" = 2 ] &&
        pass "digests offered as CRC32C,None, negotiated: $digests" || fail "negotiated digests over iSER: '$digests'"
    dev=$(lun_dev "$sid" 0) || { fail "no disk for session $sid"; return; }
    head -c 4194304 /dev/urandom >"$KL_WORK/iser.blk"
    dd if="$KL_WORK/iser.blk" of=/dev/"$dev" bs=1M seek=7 oflag=direct status=none &&
        dd if=/dev/"$dev" of="$KL_WORK/iser.back" bs=1M skip=7 count=4 iflag=direct status=none &&
        cmp -s "$KL_WORK/iser.blk" "$KL_WORK/iser.back" &&
        pass "dd 4 MiB written by RDMA Read and read back by RDMA Write" || fail "dd round trip through /dev/$dev"
    if fio_verify /dev/"$dev" 256M >"$KL_OUT/fio-iser.log" 2>&1; then
        pass "fio crc32c verify 256M QD32 over iSER: $(fio_result "$KL_OUT/fio-iser.log")"
    else
        fail "fio over iSER: $(tail -n 5 "$KL_OUT/fio-iser.log" | tr '\n' ' ')"
    fi
    mkdir -p "$KL_WORK/iser-mnt"
    if mkfs.ext4 -q -F /dev/"$dev" && mount /dev/"$dev" "$KL_WORK/iser-mnt"; then
        for i in 1 2 3; do head -c $((6 << 20)) /dev/urandom >"$KL_WORK/iser-mnt/f$i"; done
        (cd "$KL_WORK/iser-mnt" && sha256sum f1 f2 f3) >"$KL_WORK/iser.sums"
        umount "$KL_WORK/iser-mnt"
        fsck.ext4 -f -n /dev/"$dev" >"$KL_OUT/fsck-iser.log" 2>&1 && pass "mkfs.ext4, files, fsck clean over iSER" ||
            fail "fsck over iSER: $(tail -n 3 "$KL_OUT/fsck-iser.log" | tr '\n' ' ')"
        mount /dev/"$dev" "$KL_WORK/iser-mnt" && (cd "$KL_WORK/iser-mnt" && sha256sum -c --quiet "$KL_WORK/iser.sums") &&
            pass "files read back after remount: sha256 match" || fail "read back over iSER"
        umount "$KL_WORK/iser-mnt" 2>/dev/null
    else
        fail "mkfs.ext4/mount /dev/$dev"
    fi
    out=$(iscsiadm -m node -T "$IQN" -p 10.77.0.1:3260 -I iser --logout 2>&1) && pass "logout" || fail "logout: $out"
    # Log in again: a new RDMA connection and session, the same LUN and data.
    out=$(timeout 120 iscsiadm -m node -T "$IQN" -p 10.77.0.1:3260 -I iser --login 2>&1) &&
        pass "login again over iSER after logout" || { fail "iSER re-login: $out"; return; }
    sid=$(session_id "$IQN" iser)
    dev=$(lun_dev "$sid" 0) || { fail "no disk after re-login"; return; }
    if mount /dev/"$dev" "$KL_WORK/iser-mnt" && (cd "$KL_WORK/iser-mnt" && sha256sum -c --quiet "$KL_WORK/iser.sums"); then
        pass "after reconnecting, the files read back: sha256 match"
    else
        fail "read back after reconnecting"
    fi
    umount "$KL_WORK/iser-mnt" 2>/dev/null
    out=$(iscsiadm -m node -T "$IQN" -p 10.77.0.1:3260 -I iser --logout 2>&1) && pass "second logout" || fail "second logout: $out"
    # blockwire's iSER initiator against the same portal.
    [ -x "$ISER_CHECK" ] || fail "no $ISER_CHECK (cargo build --release -p blockwire-tests --features blockwire-transport/verbs --example iser_check)"
    run_suite iser-initiator-blockwire iser-initiator "$ISER_CHECK" verbs 10.77.0.1:3260 "$IQN" rxe0
    attach_rdma
    if grep -q "WARN\|ERROR" "$KL_OUT/iser-target.log"; then
        fail "the iSER target logged warnings: $(grep 'WARN\|ERROR' "$KL_OUT/iser-target.log" | head -n 3 | tr '\n' ' ')"
    else
        pass "the iSER target logged no warning"
    fi
    stop_target "$ISER_PID"
}
# ---- the blockwire_scsi kernel host on an RDMA-assisted session (same target, TCP portal) ----
attach_rdma() {
    local ko=${BLOCKWIRE_BUILD:-$KL_REPO/build}/kmod/blockwire_scsi.ko log=$KL_OUT/attach-rdma.log apid host dev
    modprobe -a sd_mod sg && insmod "$ko" && pass "insmod blockwire_scsi.ko" || { fail "insmod $ko"; return; }
    "$KL_BIN/blockwire" --initiator-name iqn.2026-11.lab:attach-rdma --data-path rdma --rdma-backend verbs \
        --rdma-device rxe0 attach -p 10.77.0.1:3260 -T "$IQN" --qd 16 >"$log" 2>&1 &
    apid=$!
    if ! timeout 120 bash -c 'until grep -q "^blockwire attach: host[0-9]* serves" "$1"; do
            kill -0 "$2" 2>/dev/null || exit 1; sleep 0.2; done' _ "$log" "$apid"; then
        fail "blockwire attach over RDMA: $(tail -n 3 "$log" | tr '\n' ' ')"
        rmmod blockwire_scsi
        return
    fi
    pass "$(grep '^blockwire attach: host' "$log")"
    host=$(sed -n 's/^blockwire attach: host\([0-9]*\) serves.*/\1/p' "$log")
    dev=$(host_disk "$host" 0)
    if [ -n "$dev" ] && fio_verify "/dev/$dev" 64M >"$KL_OUT/fio-attach-rdma.log" 2>&1; then
        pass "fio crc32c verify 64M QD32 through /dev/$dev on blockwire_scsi over RDMA-assisted iSCSI: $(fio_result "$KL_OUT/fio-attach-rdma.log")"
    else
        fail "fio through the RDMA-assisted kernel host (/dev/$dev): $(tail -n 3 "$KL_OUT/fio-attach-rdma.log" 2>/dev/null | tr '\n' ' ')"
    fi
    kill -TERM "$apid"
    timeout 120 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.2; done' _ "$apid" || kill -KILL "$apid"
    wait "$apid"
    local last
    last=$(grep "detached" "$log" | tail -n 1)
    if grep -Eq "data by RDMA: [1-9][0-9]* reads and [1-9][0-9]* writes" <<<"$last"; then
        pass "the kernel's READs and WRITEs moved by RDMA: $last"
    else
        fail "no RDMA data movement reported: '$last' $(tail -n 3 "$log" | tr '\n' ' ')"
    fi
    check "rmmod blockwire_scsi after the RDMA host" rmmod blockwire_scsi
}

iser_suite

# ---- blockwire's iSER initiator against LIO's iSER target (ib_isert) ----
lio_iser_suite() {
    local lio=iqn.2003-01.org.linux-iscsi.lab:lio-iser
    modprobe configfs && { mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config; } &&
        modprobe -a target_core_mod iscsi_target_mod target_core_file ib_isert &&
        pass "LIO modules with ib_isert" || { fail "LIO modules (ib_isert)"; return; }
    truncate -s 256M "$KL_WORK/lio-iser.img"
    if out=$(python3 "$(dirname "$0")/lio_iser.py" "$KL_WORK/lio-iser.img" 10.77.0.1 3262 2>&1); then
        pass "LIO iSER portal: $(tail -n 1 <<<"$out")"
    else
        fail "LIO iSER setup: $(tail -n 3 <<<"$out" | tr '\n' ' ')"
        return
    fi
    RUST_LOG=blockwire_initiator=debug run_suite iser-initiator-lio iser-initiator "$ISER_CHECK" verbs 10.77.0.1:3262 "$lio" rxe0
    dmesg | tail -n 60 >"$KL_OUT/dmesg-lio-iser.log" || true
}
lio_iser_suite

dmesg | grep -i -E "rxe|rdma|iser" | tail -n 30 >"$KL_OUT/dmesg-rdma.log" || true
finish rdma
