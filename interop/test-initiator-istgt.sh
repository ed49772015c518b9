#!/bin/bash
# interop/test-initiator-istgt.sh — blockwire's initiator against istgt (Debian package istgt,
# a third-party user-space target). istgt missing or not starting is a FAIL, never a skip.
#
# istgt on a free 127.0.0.1 port, one 256 MiB file LUN, AuthMethod CHAP (one-way or mutual).
#   discovery                 blockwire discover; blockwire iscsiadm -m discovery -t st (iscsiadm
#                             output format HOST:PORT,TPGT IQN)
#   login                     no CHAP: refused; wrong secret: refused; wrong mutual secret: our
#                             side refuses the target; one-way CHAP and mutual CHAP: READ CAPACITY
#   INQUIRY                   vendor/product/serial from istgt
#   write/read-back           64 MiB of random data written at queue depth 32 (blockwire dd),
#                             read back at queue depth 32, SHA-256 equal
#   FUSE                      blockwire mount with CHAP, 8 MiB O_DIRECT|O_DSYNC at an offset
#                             through MNT/lun0 and back, SHA-256 equal; SIGTERM ends it
#
# Prints each step; exits 1 on failure, including when istgt is absent or does not start (its
# log is shown), or when root or /dev/fuse is missing for the FUSE step. Bounded (re-executes
# itself under timeout); cleans up in a trap.
set -euo pipefail
if [ -z "${_BW_ISTGT_TIMED:-}" ]; then
    export _BW_ISTGT_TIMED=1
    exec timeout -k 20 "${BW_ISTGT_TIMEOUT:-300}" "$0" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib/blockwire.sh"

step() { printf '==== %s\n' "$*"; }
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }

command -v istgt >/dev/null || fail "istgt is not installed (apt-get install istgt; .ci/run does)"
[ "$(id -u)" = 0 ] || fail "the FUSE step needs root"
[ -c /dev/fuse ] || fail "/dev/fuse is missing: the FUSE step cannot run"
bw=$(blockwire_cli) || fail "release build of the blockwire CLI failed"

USER=alice SECRET=alice-secret-12 TUSER=target TSECRET=target-secret-34
tmp=$(mktemp -d /tmp/bw-istgt.XXXXXX)
istgt_pid="" mount_pid=""
cleanup() {
    set +e
    if [ -n "$mount_pid" ]; then
        kill -TERM "$mount_pid" 2>/dev/null
        timeout 20 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.1; done' _ "$mount_pid" ||
            kill -KILL "$mount_pid" 2>/dev/null
        mountpoint -q "$tmp/mnt" && { fusermount3 -u -z "$tmp/mnt" 2>/dev/null || umount -l "$tmp/mnt"; }
    fi
    [ -n "$istgt_pid" ] && stop_pid "$istgt_pid"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'echo interrupted; exit 1' INT TERM

port=$(free_port)
portal=127.0.0.1:$port
IQN=iqn.2026-11.io.istgt:disk1
truncate -s 256M "$tmp/disk.img"
cat >"$tmp/auth.conf" <<CONF
[AuthGroup1]
  Auth "$USER" "$SECRET" "$TUSER" "$TSECRET"
CONF
cat >"$tmp/istgt.conf" <<CONF
[Global]
  NodeBase "iqn.2026-11.io.istgt"
  PidFile $tmp/istgt.pid
  AuthFile $tmp/auth.conf
  MediaDirectory $tmp
  LogFacility "local7"
  Timeout 30
  NopInInterval 20
  DiscoveryAuthMethod Auto
  MaxSessions 16
  MaxConnections 4
  MaxR2T 32
  MaxOutstandingR2T 16
  DefaultTime2Wait 2
  DefaultTime2Retain 60
  FirstBurstLength 262144
  MaxBurstLength 1048576
  MaxRecvDataSegmentLength 262144
  InitialR2T Yes
  ImmediateData Yes
  DataPDUInOrder Yes
  DataSequenceInOrder Yes
  ErrorRecoveryLevel 0
[UnitControl]
  AuthMethod None
[PortalGroup1]
  Portal DA1 $portal
[InitiatorGroup1]
  InitiatorName "ALL"
  Netmask 127.0.0.1
[LogicalUnit1]
  TargetName disk1
  Mapping PortalGroup1 InitiatorGroup1
  AuthMethod CHAP
  AuthGroup AuthGroup1
  UseDigest Auto
  UnitType Disk
  QueueDepth 32
  LUN0 Storage $tmp/disk.img Auto
CONF

step "start istgt on $portal ($(istgt -V 2>&1 | head -n 1))"
istgt -c "$tmp/istgt.conf" -D >"$tmp/istgt.log" 2>&1 </dev/null &
istgt_pid=$!
if ! timeout 10 bash -c 'until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
        kill -0 "$2" 2>/dev/null || exit 1; sleep 0.1; done' _ "$port" "$istgt_pid"; then
    echo "    istgt log ($tmp/istgt.log):"
    sed 's/^/    /' "$tmp/istgt.log"
    fail "istgt did not start: it exited or did not listen on $portal within 10 s (log above)"
fi

chap=(--chap-user "$USER" --chap-secret "$SECRET")
mutual=(--mutual-user "$TUSER" --mutual-secret "$TSECRET")

step "discovery: blockwire discover -p $portal"
"$bw" discover -p "$portal" | tee "$tmp/disc" | sed 's/^/    /'
grep -qx "$IQN" "$tmp/disc" || fail "discovery did not list $IQN"
step "discovery: blockwire iscsiadm -m discovery -t sendtargets -p $portal"
out=$("$bw" iscsiadm -m discovery -t sendtargets -p "$portal" --config-dir "$tmp/nodes")
echo "    $out"
[ "$out" = "$portal,1 $IQN" ] || fail "iscsiadm-format line: got '$out'"

expect_refused() {
    local what=$1
    shift
    local rc=0
    "$bw" readcap -p "$portal" -T "$IQN" "$@" >"$tmp/out" 2>&1 || rc=$?
    echo "    $what: exit $rc: $(tail -n 1 "$tmp/out")"
    [ "$rc" != 0 ] || fail "$what: login succeeded"
}
step "login refused without CHAP / with a wrong secret / with a wrong mutual secret"
expect_refused "no CHAP"
expect_refused "wrong secret" --chap-user "$USER" --chap-secret wrong-secret-99
expect_refused "wrong mutual secret" "${chap[@]}" --mutual-user "$TUSER" --mutual-secret wrong-secret-98
grep -q "mutual" "$tmp/out" || fail "the wrong mutual answer was not reported as such"

step "login with one-way CHAP, then mutual CHAP: READ CAPACITY"
"$bw" readcap -p "$portal" -T "$IQN" "${chap[@]}" | sed 's/^/    /'
"$bw" readcap -p "$portal" -T "$IQN" "${chap[@]}" "${mutual[@]}" | grep Capacity | sed 's/^/    mutual: /'
step "INQUIRY"
"$bw" inq -p "$portal" -T "$IQN" "${chap[@]}" | sed 's/^/    /'

url="iscsi://$USER%$SECRET@$portal/$IQN/0"
step "write 64 MiB of random data at queue depth 32, read it back at queue depth 32"
head -c $((64 << 20)) /dev/urandom >"$tmp/data"
"$bw" dd --if "$tmp/data" --of "$url" --bs 1M --qd 32 --quiet 2>&1 | sed 's/^/    /'
"$bw" dd --if "$url" --of "$tmp/back" --bs 1M --qd 32 --count 64 --quiet 2>&1 | sed 's/^/    /'
a=$(sha256sum <"$tmp/data" | cut -d' ' -f1) b=$(sha256sum <"$tmp/back" | cut -d' ' -f1)
echo "    written $a"
echo "    read    $b"
[ "$a" = "$b" ] || fail "read-back differs"

{
    step "blockwire mount (CHAP) $tmp/mnt; 8 MiB O_DIRECT|O_DSYNC through lun0 and back"
    mkdir -p "$tmp/mnt"
    "$bw" mount -p "$portal" -T "$IQN" "${chap[@]}" "$tmp/mnt" >"$tmp/mount.log" 2>&1 </dev/null &
    mount_pid=$!
    timeout 20 bash -c 'until [ -e "$1/lun0" ]; do kill -0 "$2" 2>/dev/null || exit 1; sleep 0.1; done' \
        _ "$tmp/mnt" "$mount_pid" || { cat "$tmp/mount.log"; fail "no lun0 in the FUSE mount"; }
    head -c $((8 << 20)) /dev/urandom >"$tmp/data8"
    dd if="$tmp/data8" of="$tmp/mnt/lun0" bs=1M seek=100 conv=notrunc oflag=direct,dsync status=none ||
        fail "write through the FUSE file"
    dd if="$tmp/mnt/lun0" of="$tmp/back8" bs=1M skip=100 count=8 iflag=direct status=none ||
        fail "read through the FUSE file"
    a=$(sha256sum <"$tmp/data8" | cut -d' ' -f1) b=$(sha256sum <"$tmp/back8" | cut -d' ' -f1)
    echo "    written $a"
    echo "    read    $b"
    [ "$a" = "$b" ] || fail "FUSE read-back differs"
    kill -TERM "$mount_pid"
    rc=0
    wait "$mount_pid" || rc=$?
    mount_pid=""
    sed 's/^/    /' "$tmp/mount.log"
    [ "$rc" = 0 ] || fail "blockwire mount exited $rc"
}

step "stop istgt"
stop_pid "$istgt_pid"
istgt_pid=""
echo "PASS: test-initiator-istgt"
