#!/usr/bin/env bash
# interop/kernel/guest-ocfs2.sh ROLE — runs INSIDE one of two kernel lab guests joined by a
# private link (see interop/test-kernel-lab.sh, suite ocfs2). ROLE is node1 or node2.
#
# An OCFS2 cluster of two kernel nodes on one blockwire LUN:
#   node1 (10.99.0.1) runs blockwire-target with a file LUN on a tmpfs, and is cluster node 1;
#   node2 (10.99.0.2) is cluster node 2. Both log in with open-iscsi to the same LUN over the
#   link, join an o2cb cluster (cluster.conf, configfs, disk heartbeat), and then:
#   - mkfs.ocfs2 -N 2 on node1, the file system mounted on both nodes at once;
#   - each node writes its own files and appends to a shared log under a cluster flock; each
#     checksums what the other wrote; both list the same tree (same inode numbers);
#   - the target restarts (SIGTERM, a new process on the same config) while both nodes write
#     with fsync, in less time than the o2cb heartbeat dead threshold: nobody fences itself,
#     both keep writing, the LUN's identity (VPD 80h/83h, /dev/disk/by-id) is unchanged;
#   - both unmount, fsck.ocfs2 -fn is clean, both mount again and every file checks out;
#   - fence_scsi's way of cutting a node off: both register keys, node1 reserves WRITE
#     EXCLUSIVE - REGISTRANTS ONLY, node2 PREEMPT AND ABORTs node1; node1's writes meet
#     RESERVATION CONFLICT while node2 keeps writing to the mounted file system.
# The guests wait for each other through files in KL_SYNC (shared with the host), every wait
# bounded. Env: KL_OUT (this node's results), KL_SYNC, KL_O2HB_DEAD (heartbeat dead threshold,
# default 31 iterations of 2 s: o2cb's own default, a 60 s limit the target restart must beat).
ROLE=${1:?usage: guest-ocfs2.sh node1|node2}
case $ROLE in
node1) PEER=node2 N=1 ;;
node2) PEER=node1 N=2 ;;
*) echo "guest-ocfs2.sh: ROLE is node1 or node2, not $ROLE" >&2; exit 2 ;;
esac
export KL_INITIATOR=iqn.2026-11.lab:bw$ROLE
. "$(dirname "$0")/lib.sh"
: "${KL_SYNC:?KL_SYNC: the directory both guests share}"

IQN=iqn.2026-11.io.blockwire:ocfs2
PORTAL=10.99.0.1:3260
CLUSTER=bwlab
MNT=$KL_WORK/ocfs2 # /mnt is part of the read-only root
LUN_MIB=640
DEAD=${KL_O2HB_DEAD:-31}
# o2hb fences a node whose heartbeat write has not completed for (dead threshold - 1) beats
# of 2 s: the longest storage outage the cluster survives.
HB_LIMIT=$(((DEAD - 1) * 2))
T_PID=""

wrap_up() {
    dmesg >"$KL_OUT/dmesg.log" 2>&1
    finish "ocfs2 $ROLE"
}
# give_up CHECK WHY: a step everything after it depends on failed; tell the peer and stop.
give_up() {
    fail "$1: $2"
    peer_say abort "$ROLE: $1"
    wrap_up
    exit 1
}
kmark() { echo "blockwire-lab: $*" >/dev/kmsg; }
mounted_rw() { awk -v m="$MNT" '$2 == m && $3 == "ocfs2" {print $4}' /proc/mounts | grep -q '^rw'; }
# identity DEV: the LUN's names as a node sees them: unit serial (VPD 80h), the NAA designator
# (VPD 83h), the WWID udev builds by-id names from, and the by-id links pointing at DEV.
identity() {
    local d=$1 serial naa wwid
    serial=$(sg_inq -p 0x80 "/dev/$d" 2>/dev/null | sed -n 's/.*Unit serial number: *//p')
    naa=$(sg_inq -p 0x83 "/dev/$d" 2>/dev/null | grep -A5 'designator_type: NAA' |
        grep -o '\[0x[0-9a-f]*\]' | head -1 | tr -d '[]')
    wwid=$(/lib/udev/scsi_id -g -u -d "/dev/$d" 2>/dev/null)
    echo "serial=$serial naa=$naa wwid=$wwid by-id=$(byid_links "$d")"
}
# byid_links DEV: the names of the /dev/disk/by-id links pointing at DEV, sorted, on one line.
byid_links() {
    local l
    for l in /dev/disk/by-id/*; do
        [ "$(readlink -f "$l")" = "/dev/$1" ] && echo "${l##*/}"
    done | sort | paste -sd ' '
}
# byid_wait DEV SECS: wait, at most SECS, until udev has made a /dev/disk/by-id link to DEV;
# prints the seconds it took. On a guest with one emulated CPU, `udevadm settle` after the login
# has returned before udev made the links of the new disk (in one CI run, a second later).
byid_wait() {
    local t0=$SECONDS
    until [ -n "$(byid_links "$1")" ]; do
        [ $((SECONDS - t0)) -ge "$2" ] && return 1
        sleep 1
    done
    echo $((SECONDS - t0))
}
# bg_done PID SECS: wait (at most SECS) for a background job that may block in the kernel
# (timeout(1) would wait on an unkillable child); its status in BG_RC.
bg_done() {
    local t0=$SECONDS
    while kill -0 "$1" 2>/dev/null; do
        [ $((SECONDS - t0)) -ge "$2" ] && return 1
        sleep 0.5
    done
    wait "$1"
    BG_RC=$?
}
listing() { (cd "$MNT" && find . -printf '%y %i %n %s %P\n' | sort -k5); }
# check_sums FILE: every "sum  path" line of FILE matches the file under $MNT now.
check_sums() { (cd "$MNT" && sha256sum --quiet -c "$1") >"$KL_WORK/sumcheck.out" 2>&1; }

# ---------------------------------------------------------------------------------------------
hostname "bw$ROLE" # o2cb finds the local node of cluster.conf by host name
nic=$(link_up "10.99.0.$N/24") || give_up "private link" "no NIC besides lo"
log "kernel $(uname -r), $(nproc) CPU, link $nic = 10.99.0.$N; shared dir: $(grep -F "$(dirname "$KL_SYNC")" /proc/mounts | awk '{print $3}' | head -1)"
lab_up || give_up "lab-up" "iSCSI modules or iscsid"
modprobe -a configfs ocfs2 ocfs2_stack_o2cb ocfs2_dlmfs || give_up "ocfs2 modules" "modprobe"
mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config
# udev gives the /dev/disk/by-id names a cluster's fstab uses.
/lib/systemd/systemd-udevd --daemon >"$KL_OUT/udevd.log" 2>&1
udevadm trigger --action=add >/dev/null 2>&1
timeout 60 udevadm settle -t 50

# The o2cb cluster: both nodes, addresses on the private link only.
mkdir -p /etc/ocfs2
rm -f /etc/ocfs2/cluster.conf
o2cb add-cluster "$CLUSTER" &&
    o2cb add-node "$CLUSTER" bwnode1 --ip 10.99.0.1 --port 7777 --number 1 &&
    o2cb add-node "$CLUSTER" bwnode2 --ip 10.99.0.2 --port 7777 --number 2 ||
    give_up "cluster.conf" "o2cb add-cluster/add-node"
sed 's/^/    cluster.conf| /' /etc/ocfs2/cluster.conf
o2cb register-cluster "$CLUSTER" >"$KL_OUT/o2cb.log" 2>&1 ||
    give_up "o2cb register-cluster" "$(cat "$KL_OUT/o2cb.log")"
echo "$DEAD" >"/sys/kernel/config/cluster/$CLUSTER/heartbeat/dead_threshold"
[ "$(cat "/sys/kernel/config/cluster/$CLUSTER/node/bw$ROLE/local" 2>/dev/null)" = 1 ] &&
    pass "o2cb cluster $CLUSTER registered in configfs: local node bw$ROLE, $(cat "/sys/kernel/config/cluster/$CLUSTER/heartbeat/mode") heartbeat, dead threshold $DEAD (${HB_LIMIT} s)" ||
    give_up "o2cb register-cluster" "bw$ROLE is not the local node"

# ---------------------------------------------------------------------------------------------
# The target, in node1, on the link's address.
if [ "$ROLE" = node1 ]; then
    mkdir -p "$KL_WORK/lun"
    mount -t tmpfs -o size=$((LUN_MIB + 64))M tmpfs "$KL_WORK/lun"
    cat >"$KL_WORK/target.toml" <<EOF
[fabric]
nop_interval_secs = 5
nop_timeout_secs = 20

[[portal_group]]
tag = 1
listen = ["$PORTAL"]

[[target]]
name = "$IQN"
allow = ["iqn.2026-11.lab:bwnode1", "iqn.2026-11.lab:bwnode2"]
[[target.lun]]
id = 0
backstore = "file"
path = "$KL_WORK/lun/ocfs2.img"
size = "${LUN_MIB}M"
EOF
    start() { # LOGNAME: a target process on the one config
        "$KL_BIN/blockwire-target" --config "$KL_WORK/target.toml" >>"$KL_OUT/$1.log" 2>&1 </dev/null &
        T_PID=$!
        wait_listen "$PORTAL" "$T_PID" 60
    }
    start target-1 || give_up "blockwire-target on $PORTAL" "$(tail -n 5 "$KL_OUT/target-1.log")"
    pass "blockwire-target (pid $T_PID) listens on $PORTAL: ${LUN_MIB} MiB file LUN on tmpfs"
    peer_say target-up
else
    peer_wait target-up 600 || give_up "target" "node1's target never came up"
fi

# Both nodes: open-iscsi over the link.
out=$(bounded 60 iscsiadm -m discovery -t sendtargets -p "$PORTAL" 2>&1)
grep -q "$IQN" <<<"$out" && pass "SendTargets over the link: $(grep "$IQN" <<<"$out")" ||
    give_up "discovery over the link" "$out"
bounded 90 iscsiadm -m node -T "$IQN" -p "$PORTAL" --login >"$KL_OUT/login.log" 2>&1 ||
    give_up "login" "$(cat "$KL_OUT/login.log")"
sid=$(session_id "$IQN")
dev=$(lun_dev "$sid" 0) || give_up "LUN 0 as a disk" "session $sid has no sd device"
timeout 60 udevadm settle -t 50
pass "$KL_INITIATOR logged in (session $sid): LUN 0 is /dev/$dev, $(($(blockdev --getsize64 "/dev/$dev") >> 20)) MiB"
if waited=$(byid_wait "$dev" 60); then
    [ "$waited" = 0 ] || log "udev made the by-id links of /dev/$dev ${waited} s after udevadm settle"
else
    log "no by-id link to /dev/$dev 60 s after udevadm settle; udev's record of it:"
    udevadm info --query=all --name="/dev/$dev" 2>&1 | sed 's/^/    /'
fi
sg_inq -p 0x83 "/dev/$dev" >"$KL_OUT/vpd83-before.txt" 2>&1
ID1=$(identity "$dev")
log "identity: $ID1"
grep -q 'serial=[0-9a-f]\{8,\} naa=0x[0-9a-f]\{8,\} wwid=[0-9a-f]' <<<"$ID1" &&
    pass "$ROLE reads the LUN's serial (VPD 80h), NAA (VPD 83h) and WWID" ||
    fail "$ROLE: incomplete identity: $ID1"
grep -q 'by-id=[^ ]' <<<"$ID1" && pass "udev names the LUN: $(sed 's/.*by-id=//' <<<"$ID1")" ||
    fail "no /dev/disk/by-id name for /dev/$dev (udev)"
peer_say "id1-$ROLE" "$ID1"
if [ "$ROLE" = node1 ]; then
    peer_wait id1-node2 300 || give_up "node2 login" "node2 never logged in"
    [ "$(peer_get id1-node2)" = "$ID1" ] && pass "both nodes see one LUN identity: $ID1" ||
        fail "identity differs: node1 $ID1, node2 $(peer_get id1-node2)"
fi

# ---------------------------------------------------------------------------------------------
# mkfs.ocfs2 -N 2 (node1) and the file system mounted on both nodes at once.
mkdir -p "$MNT"
if [ "$ROLE" = node1 ]; then
    if bounded 600 mkfs.ocfs2 -N 2 -J size=16M -b 4K -C 4K -L bwlab --cluster-stack=o2cb \
        --cluster-name="$CLUSTER" "/dev/$dev" </dev/null >"$KL_OUT/mkfs.log" 2>&1; then
        pass "mkfs.ocfs2 -N 2 on /dev/$dev: $(grep -E "^(Volume size|Node slots|Journal size|mkfs.ocfs2 successful)" "$KL_OUT/mkfs.log" | tr "\n" ";")"
    else
        give_up "mkfs.ocfs2" "$(tail -n 5 "$KL_OUT/mkfs.log")"
    fi
    peer_say mkfs-done
else
    peer_wait mkfs-done 900 || give_up "mkfs" "node1 never made the file system"
    # node2 joins after node1: each mount joins the DLM domain and the disk heartbeat.
    peer_wait mounted-node1 300 || give_up "mount" "node1 never mounted"
fi
bounded 300 mount -t ocfs2 "/dev/$dev" "$MNT" >"$KL_OUT/mount.log" 2>&1
mounted_rw || give_up "mount -t ocfs2" "$(cat "$KL_OUT/mount.log"; dmesg | tail -n 20)"
pass "mounted: $(grep " $MNT " /proc/mounts)"
if [ "$ROLE" = node1 ]; then
    # The shared lock and log exist before node2 mounts: two nodes creating one name at once
    # race in OCFS2 (each finds no entry, the later create meets the other's and open(2)
    # fails with EEXIST), which is the file system's rule, not the LUN's.
    : >>"$MNT/shared.lock" && : >>"$MNT/shared.log" ||
        give_up "shared files" "cannot create $MNT/shared.lock and shared.log"
fi
peer_say "mounted-$ROLE"
peer_wait "mounted-$PEER" 300 || give_up "both mounted" "$PEER never mounted"
out=$(mounted.ocfs2 -f 2>&1)
printf '%s\n' "$out" | sed 's/^/    | /'
grep -q bwnode1 <<<"$out" && grep -q bwnode2 <<<"$out" &&
    pass "mounted.ocfs2 -f: the disk is mounted on bwnode1 and bwnode2" ||
    fail "mounted.ocfs2 -f does not list both nodes"
dmesg | grep -E "o2net: (Connected|Accepted)|o2dlm: .*(Joining|Nodes in domain)|ocfs2: Mounting" |
    sed 's/^/    kernel: /'

# ---------------------------------------------------------------------------------------------
# Shared work: own files, appends to one shared log under a cluster-wide flock.
mkdir -p "$MNT/$ROLE"
for i in 1 2 3 4 5 6; do
    head -c $((i * 262144 + i * 4111)) /dev/urandom >"$KL_WORK/buf"
    cp "$KL_WORK/buf" "$MNT/$ROLE/own-$i" || fail "write $MNT/$ROLE/own-$i"
done
pad=$(printf 'x%.0s' $(seq 1 50))
APPENDS=40
exec 9>>"$MNT/shared.lock" || give_up "shared work" "cannot open $MNT/shared.lock"
lock_failures=0 append_failures=0
for i in $(seq 1 $APPENDS); do
    if flock -w 60 9; then
        printf '%s %05d %s\n' "$ROLE" "$i" "$pad" >>"$MNT/shared.log" ||
            append_failures=$((append_failures + 1))
    else
        lock_failures=$((lock_failures + 1))
    fi
    flock -u 9
done
exec 9>&-
[ $((lock_failures + append_failures)) = 0 ] &&
    pass "$ROLE appended $APPENDS lines to shared.log, each under the cluster flock" ||
    fail "$ROLE's appends to shared.log: flock failed $lock_failures times, the append $append_failures times"
sync
(cd "$MNT" && sha256sum "$ROLE"/own-*) >"$KL_WORK/sums-$ROLE"
cp "$KL_WORK/sums-$ROLE" "$KL_SYNC/sums-$ROLE.tmp" && mv "$KL_SYNC/sums-$ROLE.tmp" "$KL_SYNC/sums-$ROLE"
peer_wait "sums-$PEER" 600 || give_up "shared work" "$PEER never finished writing"
sed 's/^/    | /' "$KL_SYNC/sums-$PEER"
check_sums "$KL_SYNC/sums-$PEER" && pass "$ROLE reads $PEER's 6 files: every sha256 matches" ||
    fail "$PEER's files: $(cat "$KL_WORK/sumcheck.out")"
# The shared log: every append of both nodes, whole lines, each node's in its own order.
good=$(grep -cE "^node[12] [0-9]{5} x{50}$" "$MNT/shared.log")
total=$(wc -l <"$MNT/shared.log")
o1=$(awk '$1 == "node1" {print $2 + 0}' "$MNT/shared.log" | tr '\n' ' ')
o2=$(awk '$1 == "node2" {print $2 + 0}' "$MNT/shared.log" | tr '\n' ' ')
want=$(seq 1 $APPENDS | tr '\n' ' ')
interleave=$(awk '{print $1}' "$MNT/shared.log" | uniq | wc -l)
if [ "$good" = $((2 * APPENDS)) ] && [ "$total" = "$good" ] && [ "$o1" = "$want" ] && [ "$o2" = "$want" ]; then
    pass "shared.log: $total whole lines, both nodes' $APPENDS appends in order ($interleave runs of one node)"
else
    fail "shared.log: $good well-formed of $total lines (want $((2 * APPENDS))); node1's appends in it: $(wc -w <<<"$o1"), node2's: $(wc -w <<<"$o2")"
    sed 's/^/    | /' "$MNT/shared.log" | cut -c1-24 | head -n 100
fi
peer_say "shared-$ROLE" "$(sha256sum <"$MNT/shared.log" | cut -c1-64)"
listing >"$KL_WORK/listing-$ROLE"
peer_say "listing-$ROLE" "$(cat "$KL_WORK/listing-$ROLE")"
peer_wait "listing-$PEER" 300 && peer_wait "shared-$PEER" 10 || give_up "listing" "$PEER never listed"
[ "$(peer_get "shared-$PEER")" = "$(peer_get "shared-$ROLE")" ] &&
    pass "shared.log: the same sha256 on both nodes ($(peer_get "shared-$ROLE" | cut -c1-16)...)" ||
    fail "shared.log differs between the nodes"
if [ "$(peer_get "listing-$PEER")" = "$(cat "$KL_WORK/listing-$ROLE")" ]; then
    pass "both nodes list the same tree: $(wc -l <"$KL_WORK/listing-$ROLE") entries, same inode numbers, sha256 $(sha256sum <"$KL_WORK/listing-$ROLE" | cut -c1-16)..."
else
    fail "directory listings differ: $(diff <(peer_get "listing-$PEER") "$KL_WORK/listing-$ROLE" | head -5 | tr '\n' ' ')"
fi

# ---------------------------------------------------------------------------------------------
# A target restart under both nodes' writes. Each writer fsyncs one file at a time, so its
# writes stall while the target is away and go on when open-iscsi has logged in again.
writer() {
    local i=0 sum
    exec 8>>"$MNT/shared.lock" || return 1
    while [ ! -e "$KL_SYNC/stop-writers" ]; do
        i=$((i + 1))
        head -c 131072 /dev/urandom >"$KL_WORK/wbuf"
        dd if="$KL_WORK/wbuf" of="$MNT/$ROLE/r-$i" bs=64k conv=fsync status=none || return 1
        sum=$(sha256sum <"$KL_WORK/wbuf" | cut -c1-64)
        echo "$sum  $ROLE/r-$i" >>"$KL_WORK/rsums-$ROLE"
        flock -w 120 8 && printf '%s r%04d %s\n' "$ROLE" "$i" "$pad" >>"$MNT/shared.log" || return 1
        flock -u 8
        # One new, empty marker per file written. The other guest reads progress from names
        # alone: re-reading one file that the other guest keeps replacing can hang its read
        # forever in the lab kernel's 9p client (seen: cat stuck in netfs_retry_reads).
        : >"$KL_SYNC/progress-$ROLE.$i"
    done
    echo "$i files"
}
# progress NODE: how many files NODE's writer has written (its highest marker).
progress() {
    local f n=0
    for f in "$KL_SYNC/progress-$1".*; do
        [ -e "$f" ] && [ "${f##*.}" -gt "$n" ] && n=${f##*.}
    done
    echo "$n"
}
# wait_progress SECS GOAL1 GOAL2: until node1 has written GOAL1 files and node2 GOAL2.
wait_progress() {
    local t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$1" ]; do
        [ -e "$KL_SYNC/progress-node1.$2" ] && [ -e "$KL_SYNC/progress-node2.$3" ] && return 0
        [ -e "$KL_SYNC/abort" ] && return 1
        sleep 0.5
    done
    return 1
}
: >"$KL_WORK/rsums-$ROLE"
if [ "$ROLE" = node1 ]; then peer_say writers-go; else peer_wait writers-go 300 || give_up "restart" "no start"; fi
writer >"$KL_OUT/writer.log" 2>&1 &
W_PID=$!
if [ "$ROLE" = node1 ]; then
    if ! wait_progress 300 3 3; then
        fail "writers: node1 $(progress node1), node2 $(progress node2) files after 300 s"
    fi
    p1=$(progress node1) p2=$(progress node2)
    peer_say restarting
    kmark "SIGTERM to blockwire-target $T_PID"
    log "SIGTERM to blockwire-target $T_PID with node1 at $p1 files, node2 at $p2"
    t0=$(date +%s%N)
    stop_target "$T_PID" TERM && pass "old target process exited on SIGTERM" ||
        fail "old target process: exit $? after SIGTERM"
    start target-2 || give_up "restart" "the new target process did not listen: $(tail -n 5 "$KL_OUT/target-2.log")"
    t_listen=$((($(date +%s%N) - t0) / 1000000))
    kmark "new blockwire-target $T_PID listens"
    relogin() { grep "full feature phase.*initiator=iqn.2026-11.lab:$1 target=\"$IQN\"" "$KL_OUT/target-2.log"; }
    if timeout $((HB_LIMIT + 10)) bash -c "until grep -q 'full feature phase.*initiator=iqn.2026-11.lab:bwnode1 target=\"$IQN\"' '$KL_OUT/target-2.log' &&
        grep -q 'full feature phase.*initiator=iqn.2026-11.lab:bwnode2 target=\"$IQN\"' '$KL_OUT/target-2.log'; do sleep 0.2; done"; then
        t_back=$((($(date +%s%N) - t0) / 1000000))
        if [ "$t_back" -lt $((HB_LIMIT * 1000)) ]; then
            pass "target restart: new process (pid $T_PID) listening after ${t_listen} ms, both nodes logged in again after ${t_back} ms (< ${HB_LIMIT} s heartbeat dead threshold)"
        else
            fail "both nodes back only after ${t_back} ms, beyond the ${HB_LIMIT} s dead threshold"
        fi
    else
        fail "after the restart, not both nodes logged in within $((HB_LIMIT + 10)) s: $(relogin bwnode1 | wc -l)/$(relogin bwnode2 | wc -l)"
    fi
    kmark "both nodes logged in again"
    # Both go on writing through the new process.
    if wait_progress 300 $((p1 + 6)) $((p2 + 6)); then
        pass "both nodes kept writing after the restart: node1 $p1 -> $(progress node1), node2 $p2 -> $(progress node2) fsync'd files"
    else
        fail "writes after the restart: node1 $p1 -> $(progress node1), node2 $p2 -> $(progress node2) in 300 s"
    fi
    peer_say stop-writers
else
    peer_wait restarting 600 && kmark "node1 restarts the target now"
    peer_wait stop-writers 900 || fail "node1 never ended the restart phase"
fi
t0=$SECONDS
while kill -0 "$W_PID" 2>/dev/null && [ $((SECONDS - t0)) -lt 180 ]; do sleep 0.5; done
kill "$W_PID" 2>/dev/null
if wait "$W_PID"; then
    pass "$ROLE's writer: $(cat "$KL_OUT/writer.log") written with fsync across the restart, no error"
else
    fail "$ROLE's writer failed: $(tail -n 3 "$KL_OUT/writer.log" | tr '\n' ' ')"
fi
cp "$KL_WORK/rsums-$ROLE" "$KL_SYNC/rsums-$ROLE.tmp" && mv "$KL_SYNC/rsums-$ROLE.tmp" "$KL_SYNC/rsums-$ROLE"
peer_wait "rsums-$PEER" 300 || give_up "restart phase" "$PEER's writer never ended"
check_sums "$KL_SYNC/rsums-$PEER" && pass "$ROLE reads $PEER's $(wc -l <"$KL_SYNC/rsums-$PEER") files of the restart phase: every sha256 matches" ||
    fail "$PEER's restart-phase files: $(head -c 300 "$KL_WORK/sumcheck.out")"
mounted_rw && pass "$MNT still mounted read-write on $ROLE" || fail "$MNT not read-write on $ROLE"
fenced=$(dmesg | grep -E "o2hb: .*(timeout|fenc)|o2quo|very sorry|ocfs2: .*(error|read-only)")
[ -z "$fenced" ] && pass "$ROLE: no heartbeat timeout, fencing or file system error in the kernel log" ||
    fail "$ROLE kernel log: $fenced"
log "kernel log of $ROLE across the restart:"
dmesg | sed -n '/blockwire-lab: .*\(SIGTERM\|restarts the target\)/,$p' |
    grep -E "blockwire-lab|iscsi|connection|session|o2hb|o2net|ocfs2|sd [0-9]|I/O error" | head -n 25 |
    sed 's/^/    kernel: /'
grep -E "logout|connect to|operational after recovery|conn error" "$KL_OUT/iscsid.log" | sed 's/^/    iscsid: /'
ID2=$(identity "$dev")
sg_inq -p 0x83 "/dev/$dev" >"$KL_OUT/vpd83-after.txt" 2>&1
[ "$ID2" = "$ID1" ] && cmp -s "$KL_OUT/vpd83-before.txt" "$KL_OUT/vpd83-after.txt" &&
    pass "$ROLE: LUN identity unchanged across the restart: $ID2" ||
    fail "$ROLE: identity before: $ID1; after: $ID2"
peer_say "id2-$ROLE" "$ID2"
if [ "$ROLE" = node1 ]; then
    # SIGHUP is the daemon manager's reload signal. The file changes (a second LUN), the reload
    # applies it live, and LUN 0 keeps its unit: same sessions, same names.
    printf '\n[[target.lun]]\nid = 1\nbackstore = "ram"\nsize = "8M"\n' >>"$KL_WORK/target.toml"
    kill -HUP "$T_PID"
    if timeout 60 bash -c 'until cat "$1"/target-*.log | grep -q "LUN 1 of $2 added"; do sleep 0.2; done' \
        _ "$KL_OUT" "$IQN"; then
        applied="LUN 1 added"
    else
        applied="not applied"
    fi
    kill -0 "$T_PID" 2>/dev/null && [ "$applied" = "LUN 1 added" ] && [ "$(identity "$dev")" = "$ID1" ] &&
        mounted_rw &&
        pass "SIGHUP reload of a changed file ($applied): the target keeps running, LUN 0 identity unchanged" ||
        fail "after SIGHUP ($applied): target alive=$(kill -0 "$T_PID" 2>/dev/null && echo yes || echo no), identity $(identity "$dev")"
    peer_wait id2-node2 300 && [ "$(peer_get id2-node2)" = "$ID1" ] &&
        pass "node2's identity after the restart equals node1's before it" ||
        fail "node2 after the restart: $(peer_get id2-node2 2>/dev/null)"
fi

# ---------------------------------------------------------------------------------------------
# Both unmount; fsck.ocfs2 -fn (node1) must be clean; both mount again; every file checks out.
if [ "$ROLE" = node2 ]; then
    bounded 180 umount "$MNT" && pass "node2 unmounted" || fail "node2 umount"
    peer_say umounted-node2
    peer_wait fsck-done 900 || give_up "fsck" "node1 never checked the file system"
    peer_wait mounted2-node1 300 || give_up "remount" "node1 never mounted again"
else
    peer_wait umounted-node2 300 || fail "node2 never unmounted"
    bounded 180 umount "$MNT" && pass "node1 unmounted" || fail "node1 umount"
    bounded 600 fsck.ocfs2 -fn "/dev/$dev" >"$KL_OUT/fsck.log" 2>&1
    rc=$?
    sed 's/^/    fsck| /' "$KL_OUT/fsck.log"
    [ "$rc" = 0 ] && grep -q "All passes succeeded" "$KL_OUT/fsck.log" &&
        pass "fsck.ocfs2 -fn: All passes succeeded (exit 0)" || fail "fsck.ocfs2 -fn: exit $rc"
    peer_say fsck-done
fi
bounded 300 mount -t ocfs2 "/dev/$dev" "$MNT" >>"$KL_OUT/mount.log" 2>&1
mounted_rw && pass "$ROLE mounted again" || give_up "remount" "$(tail -n 3 "$KL_OUT/mount.log")"
peer_say "mounted2-$ROLE"
peer_wait "mounted2-$PEER" 300 || give_up "remount" "$PEER never mounted again"
cat "$KL_SYNC/sums-node1" "$KL_SYNC/sums-node2" "$KL_SYNC/rsums-node1" "$KL_SYNC/rsums-node2" >"$KL_WORK/all-sums"
check_sums "$KL_WORK/all-sums" && pass "$ROLE after fsck and remount: all $(wc -l <"$KL_WORK/all-sums") files check out" ||
    fail "after remount: $(head -c 300 "$KL_WORK/sumcheck.out")"

# ---------------------------------------------------------------------------------------------
# fence_scsi: node keys 0x1001 and 0x2002, WRITE EXCLUSIVE - REGISTRANTS ONLY held by node1,
# node2 PREEMPT AND ABORTs node1's key. The fenced node's disk heartbeat fails from then on, so
# o2hb would fence it after the dead threshold: node1 ends its checks and its guest well before.
lastlba=$(($(blockdev --getsz "/dev/$dev") - 1))
head -c 512 /dev/urandom >"$KL_WORK/blk"
# WRITE(10) of one 512-byte block at the LUN's last LBA (beyond OCFS2's data in use), through
# SG_IO so the SCSI status itself is seen.
w10() { sg_raw -s 512 -i "$KL_WORK/blk" "/dev/$dev" 2a 00 $(printf '%02x %02x %02x %02x' \
    $((lastlba >> 24 & 255)) $((lastlba >> 16 & 255)) $((lastlba >> 8 & 255)) $((lastlba & 255))) 00 00 01 00 2>&1; }
if [ "$ROLE" = node1 ]; then
    check "node1 registers key 0x1001" sg_persist -n --out --register --param-sark=0x1001 "/dev/$dev"
    peer_say pr-reg-node1
    peer_wait pr-reg-node2 300 || give_up "PR" "node2 never registered"
    check "node1 reserves WRITE EXCLUSIVE - REGISTRANTS ONLY" \
        sg_persist -n --out --reserve --param-rk=0x1001 --prout-type=5 "/dev/$dev"
    peer_say pr-reserved
    peer_wait preempted 300 || give_up "PR" "node2 never preempted"
    kmark "node2 preempted node1's key"
    out=$(w10)
    printf '%s\n' "$out" | sed 's/^/    | /' | head -3
    # The preempted I_T nexus first hears of it by unit attentions, one per command
    # (REGISTRATIONS PREEMPTED, COMMANDS CLEARED BY ANOTHER INITIATOR for its aborted
    # tasks), unless the kernel's own I/O (o2hb writes every 2 s) took them already.
    for _ in 1 2 3; do
        grep -qi "unit attention" <<<"$out" || break
        pass "fenced node1 hears a unit attention: $(grep -i -o 'Additional sense: .*' <<<"$out" | head -n 1)"
        out=$(w10)
        printf '%s\n' "$out" | sed 's/^/    | /' | head -3
    done
    grep -qi "reservation conflict" <<<"$out" && pass "fenced node1's WRITE(10): RESERVATION CONFLICT" ||
        fail "fenced node1's WRITE(10) was not refused: $out"
    head -c 65536 /dev/urandom >"$KL_WORK/fbuf"
    dd if="$KL_WORK/fbuf" of="$MNT/node1/after-fence" bs=64k oflag=direct conv=fsync \
        status=none 2>"$KL_WORK/dd.err" &
    if bg_done $! 30; then
        [ "$BG_RC" != 0 ] && pass "fenced node1's file system write fails (exit $BG_RC): $(tr '\n' ' ' <"$KL_WORK/dd.err" | head -c 160)" ||
            fail "fenced node1's file system write succeeded"
    else
        fail "fenced node1's file system write neither completed nor failed within 30 s"
    fi
    conflicts=$(dmesg | grep -ci "reservation conflict")
    [ "$conflicts" -gt 0 ] && pass "node1's kernel log: $conflicts reservation conflicts" ||
        fail "no reservation conflict in node1's kernel log"
    dmesg | sed -n '/blockwire-lab: node2 preempted/,$p' |
        grep -iE "blockwire-lab|reservation conflict|o2hb|ocfs2|I/O error" | head -n 12 | sed 's/^/    kernel: /'
    peer_say fenced-checked
    peer_wait survivor-done 60 || fail "node2 never reported its writes after the fence"
else
    peer_wait pr-reg-node1 300 || give_up "PR" "node1 never registered"
    # The survivor's file exists before the fence, created while node1 (done reading by now)
    # still answers lock requests: a create needs the directory's cluster lock, and a fenced
    # node cannot give back a lock it holds with journaled changes (atime included) until o2hb
    # declares it dead and its journal is recovered. Data writes to an inode node2 alone holds,
    # allocating from node2's own slot, need nothing from node1.
    head -c 1048576 /dev/urandom >"$KL_WORK/sbuf0"
    dd if="$KL_WORK/sbuf0" of="$MNT/node2/survivor" bs=64k conv=fsync status=none ||
        fail "node2 creates its survivor file"
    check "node2 registers key 0x2002" sg_persist -n --out --register --param-sark=0x2002 "/dev/$dev"
    peer_say pr-reg-node2
    peer_wait pr-reserved 300 || give_up "PR" "node1 never reserved"
    keys=$(sg_persist -n --in --read-keys "/dev/$dev" 2>&1)
    printf '%s\n' "$keys" | sed 's/^/    | /'
    grep -q 0x1001 <<<"$keys" && grep -q 0x2002 <<<"$keys" && pass "both keys registered" ||
        fail "READ KEYS: $keys"
    check "node2 PREEMPT AND ABORTs node1's key" \
        sg_persist -n --out --preempt-abort --param-rk=0x2002 --param-sark=0x1001 --prout-type=5 "/dev/$dev"
    res=$(sg_persist -n --in --read-reservation "/dev/$dev" 2>&1)
    printf '%s\n' "$res" | sed 's/^/    | /'
    grep -q "Key=0x2002" <<<"$res" && pass "reservation held by node2" || fail "READ RESERVATION: $res"
    kmark "node2 preempted node1's key"
    peer_say preempted
    peer_wait fenced-checked 180 || fail "node1 never reported its fenced writes"
    # The survivor keeps the file system: new data over its file, then more appended (new
    # clusters), each fsync'd and read back, the mount still read-write.
    head -c 1048576 /dev/urandom >"$KL_WORK/sbuf"
    head -c 262144 /dev/urandom >"$KL_WORK/sbuf2"
    survivor() { # WHAT DD-ARGS...: one bounded write of the survivor file
        local what=$1
        shift
        dd of="$MNT/node2/survivor" bs=64k conv=fsync,notrunc status=none "$@" 2>"$KL_WORK/sdd.err" &
        if ! bg_done $! 60; then
            fail "survivor node2's $what still blocked after 60 s"
            echo w >/proc/sysrq-trigger
            return 1
        fi
        [ "$BG_RC" = 0 ] || { fail "survivor node2's $what: exit $BG_RC $(tr '\n' ' ' <"$KL_WORK/sdd.err")"; return 1; }
    }
    if survivor overwrite if="$KL_WORK/sbuf" &&
        cmp -s "$KL_WORK/sbuf" "$MNT/node2/survivor" && mounted_rw; then
        pass "survivor node2 overwrites 1 MiB of its file after the fence: fsync'd, read back, mount rw"
    fi
    if survivor append if="$KL_WORK/sbuf2" oflag=append &&
        cmp -s <(cat "$KL_WORK/sbuf" "$KL_WORK/sbuf2") "$MNT/node2/survivor" && mounted_rw; then
        pass "survivor node2 appends 256 KiB (new clusters) after the fence: fsync'd, read back, mount rw"
    fi
    out=$(w10)
    ! grep -qi conflict <<<"$out" && pass "survivor node2's WRITE(10): no conflict" || fail "node2 WRITE(10): $out"
    grep " $MNT " /proc/mounts | sed 's/^/    | /'
    peer_say survivor-done
fi
wrap_up
