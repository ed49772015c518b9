#!/usr/bin/env bash
# interop/kernel/guest-initiator.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# open-iscsi's kernel initiator (iscsid + iscsi_tcp + the SCSI mid-layer + sd) against
# blockwire-target running in the same guest:
#   - SendTargets discovery with AuthMethod None, CHAP and mutual CHAP, and each wrong secret;
#   - login with None, CHAP, mutual CHAP; each wrong secret and the ACL refusal, with iscsiadm's
#     own exit code (24 ISCSI_ERR_LOGIN_AUTH_FAILED, 19 ISCSI_ERR_FATAL_LOGIN);
#   - a RAM, a cached-file and a direct-file LUN through /dev/sdX: fio crc32c verify of random
#     4 KiB-1 MiB writes at QD32, HeaderDigest/DataDigest CRC32C off and on;
#   - mkfs.ext4 and mkfs.xfs, fstrim (UNMAP seen as freed blocks of the backing file), fsck,
#     files read back after a remount;
#   - fence_scsi's steps on one LUN from two I_T nexuses (two iscsiadm ifaces);
#   - target restarts (SIGTERM, kill -9) during fio with verify on a file LUN.
# Env: KL_OUT (results dir shared with the host), KL_FIO_MIB (per-LUN fio size, default 256).
. "$(dirname "$0")/lib.sh"

MIB=${KL_FIO_MIB:-256}
LUN_MIB=$((MIB + 64 > 320 ? MIB + 64 : 320)) # XFS needs 300 MB at least
ME=iqn.2026-11.lab:kernel-guest
PFX=iqn.2026-11.io.blockwire
export KL_INITIATOR=$ME

lab_up || { fail "lab-up: modules or iscsid"; finish initiator; exit 1; }
log "kernel $(uname -r), $(nproc) CPUs"

# File LUNs live on ext4 on a loop device, so O_DIRECT, hole punching and `du` behave as on a
# real disk.
truncate -s $((3 * LUN_MIB + 256))M "$KL_WORK/fs.img"
mkfs.ext4 -q -F "$KL_WORK/fs.img"
mkdir -p "$KL_WORK/fs"
mount -o loop "$KL_WORK/fs.img" "$KL_WORK/fs" || { fail "backing-fs"; finish initiator; exit 1; }
FS=$KL_WORK/fs

# ---------------------------------------------------------------------------------------------
# Daemon A (127.0.0.1:3260): open discovery, the data targets, the CHAP and ACL targets.
cat >"$KL_WORK/a.toml" <<EOF
[fabric]
nop_interval_secs = 5
nop_timeout_secs = 20

[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]

[[target]]
name = "$PFX:lab-open"
[[target.lun]]
id = 0
backstore = "ram"
size = "${LUN_MIB}M"
[[target.lun]]
id = 1
backstore = "file"
path = "$FS/cached.img"
size = "${LUN_MIB}M"
mode = "cached"
[[target.lun]]
id = 2
backstore = "file"
path = "$FS/direct.img"
size = "${LUN_MIB}M"
mode = "direct"

[[target]]
name = "$PFX:lab-chap"
chap = [{ user = "alice", secret = "alice-secret-12" }]
[[target.lun]]
id = 0
backstore = "ram"
size = "16M"

[[target]]
name = "$PFX:lab-mutual"
chap = [{ user = "bob", secret = "bob-secret-1234" }]
mutual_chap = { user = "lab-target", secret = "target-secret-1" }
[[target.lun]]
id = 0
backstore = "ram"
size = "16M"

[[target]]
name = "$PFX:lab-acl"
allow = ["iqn.2026-11.lab:somebody-else"]
[[target.lun]]
id = 0
backstore = "ram"
size = "16M"

[[target]]
name = "$PFX:lab-pr"
allow = ["$ME", "iqn.2026-11.lab:node2"]
[[target.lun]]
id = 0
backstore = "ram"
size = "64M"
EOF

# Daemon B (127.0.0.1:3270): discovery behind CHAP, with the target's mutual-CHAP answer.
cat >"$KL_WORK/b.toml" <<EOF
[[portal_group]]
tag = 1
listen = ["127.0.0.1:3270"]

[discovery]
chap = [{ user = "disc-user", secret = "disc-secret-123" }]
mutual_chap = { user = "disc-target", secret = "disc-target-sec" }

[[target]]
name = "$PFX:lab-disc"
[[target.lun]]
id = 0
backstore = "ram"
size = "16M"
EOF

start_target a "$KL_WORK/a.toml" || { fail "start daemon A"; finish initiator; exit 1; }
A_PID=$KL_TPID
start_target b "$KL_WORK/b.toml" || { fail "start daemon B"; finish initiator; exit 1; }
B_PID=$KL_TPID

# expect_rc NAME WANT CMD...: CMD's exit status must be WANT; its output goes to the log.
expect_rc() {
    local name=$1 want=$2 out rc
    shift 2
    out=$("$@" 2>&1)
    rc=$?
    printf '%s\n' "$out" | sed 's/^/    | /' | tail -n 4
    if [ "$rc" = "$want" ]; then pass "$name: exit $rc"; else fail "$name: exit $rc, want $want"; fi
}

# ---------------------------------------------------------------------------------------------
log "SendTargets discovery"
out=$(iadm -m discovery -t sendtargets -p 127.0.0.1:3260)
rc=$?
printf '%s\n' "$out" | sed 's/^/    | /'
if [ $rc = 0 ] && grep -q "127.0.0.1:3260,1 $PFX:lab-open" <<<"$out" &&
    grep -q "$PFX:lab-chap" <<<"$out" && ! grep -q "$PFX:lab-acl" <<<"$out"; then
    pass "discovery None: lab-open, lab-chap listed; lab-acl (not in its ACL) hidden"
else
    fail "discovery None: exit $rc"
fi

disc_b() { # user secret [user_in secret_in]
    iscsiadm -m discoverydb -t sendtargets -p 127.0.0.1:3270 -o delete >/dev/null 2>&1
    iscsiadm -m discoverydb -t sendtargets -p 127.0.0.1:3270 -o new >/dev/null || return 99
    if [ -n "${1:-}" ]; then
        local u=discovery.sendtargets.auth
        iscsiadm -m discoverydb -t sendtargets -p 127.0.0.1:3270 -o update -n $u.authmethod -v CHAP
        iscsiadm -m discoverydb -t sendtargets -p 127.0.0.1:3270 -o update -n $u.username -v "$1"
        iscsiadm -m discoverydb -t sendtargets -p 127.0.0.1:3270 -o update -n $u.password -v "$2"
        if [ -n "${3:-}" ]; then
            iscsiadm -m discoverydb -t sendtargets -p 127.0.0.1:3270 -o update -n $u.username_in -v "$3"
            iscsiadm -m discoverydb -t sendtargets -p 127.0.0.1:3270 -o update -n $u.password_in -v "$4"
        fi
    fi
    iscsiadm -m discoverydb -t sendtargets -p 127.0.0.1:3270 --discover
}
expect_rc "discovery CHAP required, none given" 24 disc_b
expect_rc "discovery CHAP wrong secret" 24 disc_b disc-user wrong-secret-000
expect_rc "discovery CHAP" 0 disc_b disc-user disc-secret-123
expect_rc "discovery mutual CHAP" 0 disc_b disc-user disc-secret-123 disc-target disc-target-sec
expect_rc "discovery mutual CHAP, target's secret wrong" 19 \
    disc_b disc-user disc-secret-123 disc-target not-the-secret1

# ---------------------------------------------------------------------------------------------
log "login: AuthMethod None, CHAP, mutual CHAP, ACL"
node_set() { # iqn key value
    iscsiadm -m node -T "$1" -p 127.0.0.1:3260 -o update -n "$2" -v "$3" >/dev/null
}
node_auth() { # iqn [user secret [user_in secret_in]]
    local t=$1
    node_set "$t" node.session.auth.authmethod "$([ -n "${2:-}" ] && echo CHAP || echo None)"
    node_set "$t" node.session.auth.username "${2:-}"
    node_set "$t" node.session.auth.password "${3:-}"
    node_set "$t" node.session.auth.username_in "${4:-}"
    node_set "$t" node.session.auth.password_in "${5:-}"
}
login() { bounded 120 iscsiadm -m node -T "$1" -p 127.0.0.1:3260 --login; }
logout() { bounded 120 iscsiadm -m node -T "$1" -p 127.0.0.1:3260 --logout; }

node_auth "$PFX:lab-chap"
expect_rc "login CHAP target without CHAP" 24 login "$PFX:lab-chap"
node_auth "$PFX:lab-chap" alice wrong-secret-000
expect_rc "login CHAP wrong secret" 24 login "$PFX:lab-chap"
node_auth "$PFX:lab-chap" mallory alice-secret-12
expect_rc "login CHAP unknown user" 24 login "$PFX:lab-chap"
node_auth "$PFX:lab-chap" alice alice-secret-12
expect_rc "login CHAP" 0 login "$PFX:lab-chap"
expect_rc "logout CHAP" 0 logout "$PFX:lab-chap"

node_auth "$PFX:lab-mutual" bob bob-secret-1234 lab-target target-secret-1
expect_rc "login mutual CHAP" 0 login "$PFX:lab-mutual"
expect_rc "logout mutual CHAP" 0 logout "$PFX:lab-mutual"
node_auth "$PFX:lab-mutual" bob bob-secret-1234 lab-target not-the-secret1
expect_rc "login mutual CHAP, target's secret wrong" 19 login "$PFX:lab-mutual"
node_auth "$PFX:lab-mutual" bob wrong-secret-000 lab-target target-secret-1
expect_rc "login mutual CHAP, own secret wrong" 24 login "$PFX:lab-mutual"

iscsiadm -m node -o new -T "$PFX:lab-acl" -p 127.0.0.1:3260 >/dev/null
expect_rc "login refused by the target's ACL" 24 login "$PFX:lab-acl"
iscsiadm -m node -o new -T "$PFX:lab-nonexistent" -p 127.0.0.1:3260 >/dev/null
expect_rc "login to a target that does not exist" 19 login "$PFX:lab-nonexistent"
if [ -z "$(iscsiadm -m session 2>/dev/null)" ]; then
    pass "no session left behind by the refused logins"
else
    fail "sessions left: $(iscsiadm -m session 2>&1)"
fi

# ---------------------------------------------------------------------------------------------
# digests NAME VALUE: set HeaderDigest and DataDigest of lab-open's node.
digests() {
    node_set "$PFX:lab-open" 'node.conn[0].iscsi.HeaderDigest' "$1"
    node_set "$PFX:lab-open" 'node.conn[0].iscsi.DataDigest' "$1"
}
# negotiated SID: "HeaderDigest DataDigest" as the kernel reports them.
negotiated() {
    iscsiadm -m session -r "$1" -P 2 2>/dev/null |
        awk '/HeaderDigest:/{h=$2} /DataDigest:/{d=$2} END{print h, d}'
}

# fio_luns SIZE TAG: fio verify on LUNs 0 (RAM), 1 (file cached), 2 (file direct) of lab-open.
fio_luns() {
    local size=$1 tag=$2 sid lun dev kind
    sid=$(session_id "$PFX:lab-open")
    for lun in 0 1 2; do
        kind=$(case $lun in 0) echo ram ;; 1) echo file-cached ;; 2) echo file-direct ;; esac)
        dev=$(lun_dev "$sid" "$lun") || { fail "fio $tag LUN $lun ($kind): no /dev/sdX"; continue; }
        log "fio verify $size on /dev/$dev (LUN $lun, $kind, $tag)"
        if fio_verify "/dev/$dev" "$size" >"$KL_OUT/fio-$tag-lun$lun.log" 2>&1; then
            pass "fio $tag LUN $lun $kind /dev/$dev $size: $(fio_result "$KL_OUT/fio-$tag-lun$lun.log")"
        else
            fail "fio $tag LUN $lun $kind /dev/$dev: $(tail -n 3 "$KL_OUT/fio-$tag-lun$lun.log" | tr '\n' ' ')"
        fi
    done
}

log "lab-open, digests off"
digests None
expect_rc "login lab-open (digests None)" 0 login "$PFX:lab-open"
sid=$(session_id "$PFX:lab-open")
d=$(negotiated "$sid")
[ "$d" = "None None" ] && pass "negotiated digests: $d" || fail "negotiated digests: '$d', want None None"
fio_luns "${MIB}M" nodigest
expect_rc "logout lab-open" 0 logout "$PFX:lab-open"

log "lab-open, HeaderDigest and DataDigest CRC32C"
digests CRC32C
expect_rc "login lab-open (digests CRC32C)" 0 login "$PFX:lab-open"
sid=$(session_id "$PFX:lab-open")
d=$(negotiated "$sid")
[ "$d" = "CRC32C CRC32C" ] && pass "negotiated digests: $d" || fail "negotiated digests: '$d', want CRC32C CRC32C"
fio_luns "$((MIB / 4))M" crc32c

# ---------------------------------------------------------------------------------------------
# fs_check LUN FSTYPE BACKING: mkfs, write files, delete half, fstrim, remount, fsck, read back.
fs_check() {
    local lun=$1 fstype=$2 backing=$3 dev mnt=$KL_WORK/mnt-$1 before=0 after=0 i
    dev=/dev/$(lun_dev "$sid" "$lun") || { fail "$fstype LUN $lun: no device"; return; }
    mkdir -p "$mnt"
    if [ "$fstype" = xfs ]; then mkfs.xfs -q -f "$dev"; else mkfs.ext4 -q -F "$dev"; fi ||
        { fail "mkfs.$fstype $dev"; return; }
    mount "$dev" "$mnt" || { fail "mount $fstype $dev"; return; }
    for i in $(seq 1 8); do
        head -c $((8 << 20)) /dev/urandom >"$mnt/f$i"
    done
    sync
    (cd "$mnt" && sha256sum f1 f3 f5 f7) >"$KL_WORK/sums-$lun"
    [ -n "$backing" ] && before=$(du -k "$backing" | cut -f1)
    rm -f "$mnt"/f2 "$mnt"/f4 "$mnt"/f6 "$mnt"/f8
    sync
    local trimmed
    trimmed=$(fstrim -v "$mnt" 2>&1)
    sync
    [ -n "$backing" ] && after=$(du -k "$backing" | cut -f1)
    if [ -n "$backing" ] && [ "$after" -lt $((before - 16384)) ]; then
        pass "fstrim $fstype LUN $lun ($trimmed): backing file ${before} KiB -> ${after} KiB allocated"
    elif [ -z "$backing" ]; then
        pass "fstrim $fstype LUN $lun: $trimmed"
    else
        fail "fstrim $fstype LUN $lun ($trimmed): backing file ${before} KiB -> ${after} KiB"
    fi
    umount "$mnt" || { fail "umount $dev"; return; }
    if [ "$fstype" = xfs ]; then
        check "xfs_repair -n $dev clean" xfs_repair -n "$dev"
    else
        check "fsck.ext4 -fn $dev clean" fsck.ext4 -fn "$dev"
    fi
    mount "$dev" "$mnt" || { fail "remount $fstype $dev"; return; }
    if (cd "$mnt" && sha256sum -c --quiet "$KL_WORK/sums-$lun"); then
        pass "$fstype LUN $lun: 4 x 8 MiB files read back after remount"
    else
        fail "$fstype LUN $lun: files differ after remount"
    fi
    umount "$mnt"
}
log "file systems (digests on)"
fs_check 1 ext4 "$FS/cached.img"
fs_check 2 xfs "$FS/direct.img"
fs_check 0 ext4 ""
expect_rc "logout lab-open" 0 logout "$PFX:lab-open"

# ---------------------------------------------------------------------------------------------
# fence_scsi's steps (fence-agents' fence_scsi: register a key per node, WRITE EXCLUSIVE -
# REGISTRANTS ONLY reservation, PREEMPT AND ABORT by the surviving node) from two I_T nexuses.
log "persistent reservations from two I_T nexuses"
iscsiadm -m iface -I node2 -o new >/dev/null
iscsiadm -m iface -I node2 -o update -n iface.initiatorname -v iqn.2026-11.lab:node2 >/dev/null
iscsiadm -m iface -I node2 -o update -n iface.transport_name -v tcp >/dev/null
iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3260 -I default -I node2 >/dev/null
expect_rc "login lab-pr as $ME" 0 iscsiadm -m node -T "$PFX:lab-pr" -p 127.0.0.1:3260 -I default --login
expect_rc "login lab-pr as iqn.2026-11.lab:node2" 0 iscsiadm -m node -T "$PFX:lab-pr" -p 127.0.0.1:3260 -I node2 --login
s1=$(session_id "$PFX:lab-pr" default)
s2=$(session_id "$PFX:lab-pr" node2)
d1=/dev/$(lun_dev "$s1" 0)
d2=/dev/$(lun_dev "$s2" 0)
log "node 1 = $d1 (session $s1), node 2 = $d2 (session $s2)"
check "node 1 registers key 0x1001" sg_persist -n --out --register --param-sark=0x1001 "$d1"
check "node 2 registers key 0x2002" sg_persist -n --out --register --param-sark=0x2002 "$d2"
check "node 1 reserves WRITE EXCLUSIVE - REGISTRANTS ONLY" \
    sg_persist -n --out --reserve --param-rk=0x1001 --prout-type=5 "$d1"
keys=$(sg_persist -n --in --read-keys "$d2" 2>&1)
printf '%s\n' "$keys" | sed 's/^/    | /'
grep -q 0x1001 <<<"$keys" && grep -q 0x2002 <<<"$keys" && pass "both keys registered" || fail "READ KEYS"
head -c 4096 /dev/urandom >"$KL_WORK/blk"
# sg_raw shows the SCSI status the LUN returned: WRITE(10) of one 512-byte block at LBA 8.
w10() { sg_raw -s 512 -i "$KL_WORK/blk" "$1" 2a 00 00 00 00 08 00 00 01 00 2>&1; }
out=$(w10 "$d2")
grep -q "SCSI Status: Good\|^$" <<<"$out" && ! grep -qi conflict <<<"$out" &&
    pass "node 2 (registrant) may write under WE-RO" || fail "node 2 write under WE-RO: $out"
check "node 2 PREEMPT AND ABORTs node 1's key" \
    sg_persist -n --out --preempt-abort --param-rk=0x2002 --param-sark=0x1001 --prout-type=5 "$d2"
res=$(sg_persist -n --in --read-reservation "$d2" 2>&1)
printf '%s\n' "$res" | sed 's/^/    | /'
grep -q "Key=0x2002" <<<"$res" && pass "reservation now held by node 2" || fail "READ RESERVATION: $res"
out=$(w10 "$d1")
printf '%s\n' "$out" | sed 's/^/    | /' | head -3
# The preempted I_T nexus first hears of it by unit attentions, one per command (SPC-4
# PREEMPT AND ABORT: REGISTRATIONS PREEMPTED, and COMMANDS CLEARED BY ANOTHER INITIATOR for
# its aborted tasks), unless the kernel's own commands took them already; the WRITE after
# them must meet the reservation.
for _ in 1 2 3; do
    grep -qi "unit attention" <<<"$out" || break
    pass "fenced node 1 hears a unit attention: $(grep -i -o 'Additional sense: .*' <<<"$out" | head -n 1)"
    out=$(w10 "$d1")
    printf '%s\n' "$out" | sed 's/^/    | /' | head -3
done
grep -qi "reservation conflict" <<<"$out" && pass "fenced node 1's WRITE: RESERVATION CONFLICT" ||
    fail "fenced node 1's WRITE was not refused: $out"
if dd if="$KL_WORK/blk" of="$d1" bs=4096 count=1 seek=4 oflag=direct 2>/dev/null; then
    fail "fenced node 1's block-layer write succeeded"
else
    pass "fenced node 1's block-layer write fails (EIO)"
fi
out=$(w10 "$d2")
! grep -qi "conflict" <<<"$out" && pass "survivor node 2's WRITE succeeds" || fail "node 2 WRITE: $out"
check "node 2 block-layer write" dd if="$KL_WORK/blk" of="$d2" bs=4096 count=1 seek=4 oflag=direct status=none
dmesg | grep -i "reservation conflict" | tail -n 2 | sed 's/^/    kernel: /'
iscsiadm -m node -T "$PFX:lab-pr" -p 127.0.0.1:3260 --logout >/dev/null 2>&1
iscsiadm -m node -I node2 -o delete >/dev/null 2>&1
iscsiadm -m iface -I node2 -o delete >/dev/null 2>&1

stop_target "$B_PID"
stop_target "$A_PID" && pass "daemon A stopped on SIGTERM with every session logged out" || fail "daemon A exit $?"

# ---------------------------------------------------------------------------------------------
# Target restarts during fio with verify: the kernel queues I/O while the session is down
# (replacement_timeout 60 s), iscsid logs in again to the new process, and fio's verify pass
# reads every block back through the restarted target.
log "target restarts during fio verify"
cat >"$KL_WORK/c.toml" <<EOF
[fabric]
nop_interval_secs = 5
[[portal_group]]
tag = 1
listen = ["127.0.0.1:3280"]
[[target]]
name = "$PFX:lab-restart"
[[target.lun]]
id = 0
backstore = "file"
path = "$FS/restart.img"
size = "${LUN_MIB}M"
EOF
start_target c "$KL_WORK/c.toml" || fail "start daemon C"
C_PID=$KL_TPID
iscsiadm -m discovery -t sendtargets -p 127.0.0.1:3280 >/dev/null
iscsiadm -m node -T "$PFX:lab-restart" -p 127.0.0.1:3280 -o update \
    -n node.session.timeo.replacement_timeout -v 60 >/dev/null
expect_rc "login lab-restart" 0 iscsiadm -m node -T "$PFX:lab-restart" -p 127.0.0.1:3280 --login
sid=$(session_id "$PFX:lab-restart")
dev=$(lun_dev "$sid" 0)
fio_verify "/dev/$dev" "${MIB}M" >"$KL_OUT/fio-restart.log" 2>&1 &
fio_pid=$!
restart() { # SIGNAL
    # a restart every eighth of the run's writes
    wait_written "$dev" $((MIB * 2048 / 8)) 300
    log "SIG$1 to blockwire-target $C_PID after $(($(sectors_written "$dev") / 2048)) MiB written"
    stop_target "$C_PID" "$1"
    start_target "c-after-$1" "$KL_WORK/c.toml" || fail "restart daemon C after SIG$1"
    C_PID=$KL_TPID
    # iscsid logs in again (to the new process) within the replacement timeout.
    if timeout 120 bash -c 'until grep -q "login complete: full feature phase" "$1"; do sleep 0.5; done' \
        _ "$KL_OUT/c-after-$1.log"; then
        pass "after SIG$1 open-iscsi logged in to the new target process"
    else
        fail "after SIG$1 no re-login within 120 s"
    fi
}
restart TERM
restart KILL
if wait "$fio_pid"; then
    pass "fio verify across two restarts: $(fio_result "$KL_OUT/fio-restart.log")"
else
    fail "fio across restarts: $(tail -n 5 "$KL_OUT/fio-restart.log" | tr '\n' ' ')"
fi
dmesg | grep -E "connection[0-9:]+ detected conn error|session recovery|iscsi: registered" | tail -n 6 |
    sed 's/^/    kernel: /'
iscsiadm -m node -T "$PFX:lab-restart" -p 127.0.0.1:3280 --logout >/dev/null 2>&1
stop_target "$C_PID"

dmesg >"$KL_OUT/dmesg-initiator.log"
finish initiator
