#!/usr/bin/env bash
# interop/kernel/guest-lio-conformance.sh — runs INSIDE the kernel lab guest (driven by
# interop/conformance-lio.sh). LIO, the kernel's own iSCSI target, under libiscsi's
# conformance family, as the third column of interop/results/conformance.md.
#
# LIO comes up through ../shared/kernel-lab/lio-up.py (rtslib-fb): a 1 GiB fileio backstore
# on a file in the guest's /tmp, LUN 0 of iqn.2003-01.org.linux-iscsi.lab:lio on
# 127.0.0.1:3260, open ACL (generate_node_acls, so both iscsi-test-cu initiator names get in),
# emulate_tpu/tpws/caw/3pc on. Then every suite runs exactly as interop/conformance.sh runs it
# against blockwire and tgtd: one `iscsi-test-cu -d -t ALL.SUITE` process per suite under a
# timeout, through interop/lib/testcu.sh's testcu_run, so the per-test verdicts come from the
# same parser (interop/lib/testcu_parse.py). MultipathIO additionally gets the same URL as its
# second path, as conformance-variants.sh gives blockwire; without one it only skips.
#
# Writes to $KL_OUT: raw/SUITE.out and raw/SUITE.res (testcu_run), raw/SUITE.secs, lio.txt
# (kernel, rtslib, the backstore's attributes as LIO reports them), dmesg-TIME.log.
# Env: KL_OUT (host-shared results dir), SUITES or SUITES_FILE (a file in a shared directory
# holding the list; default: the whole ALL family),
# SUITE_TIMEOUT (seconds per suite, default 600: the guest's CPU is emulated), LIO_UP (path of
# lio-up.py), LIO_BLOCK_SIZE (the LUN's logical block size; default LIO's 512).
# Prints one PASS/FAIL line per step of the harness itself (LIO up, each suite produced a
# verdict line for every test it lists); test results are data, not checks: a FAILED test on
# LIO does not fail this script, a suite that left tests ABORTED/NOTRUN is reported as such.
. "$(dirname "$0")/lib.sh"
. "$KL_REPO/interop/lib/testcu.sh"

LIO_UP=${LIO_UP:-$KL_REPO/../shared/kernel-lab/lio-up.py}
IQN=iqn.2003-01.org.linux-iscsi.lab:lio
PORT=3260
URL="iscsi://127.0.0.1:$PORT/$IQN/0"
SECS=${SUITE_TIMEOUT:-600}
raw=$KL_OUT/raw
mkdir -p "$raw"
# rtslib-fb is Debian's python3-rtslib-fb: the system interpreter, whatever else is on PATH.
PY=/usr/bin/python3

ip link set lo up
if modprobe configfs && { mountpoint -q /sys/kernel/config || mount -t configfs none /sys/kernel/config; } &&
    modprobe -a target_core_mod iscsi_target_mod target_core_file; then
    pass "LIO modules (target_core_mod, iscsi_target_mod, target_core_file)"
else
    fail "LIO modules"
    finish lio-conformance
    exit 1
fi

# LIO writes its persistent-reservation file DBROOT/pr/aptpl_<serial> on every PROUT REGISTER,
# APTPL or not, and answers NOT READY, LOGICAL UNIT COMMUNICATION FAILURE when it cannot: every
# PR test then fails for want of a directory, which the guest's fresh /var does not have:
# create it under the kernel's default dbroot (lio-up.py does not move dbroot, and it cannot
# move once a device is registered).
dbroot=$(cat /sys/kernel/config/target/dbroot 2>/dev/null)
if [ -n "$dbroot" ] && mkdir -p "$dbroot/pr"; then
    pass "LIO dbroot $dbroot with pr/"
else
    fail "LIO dbroot '${dbroot}': cannot create pr/"
fi

# The backing file lives in the guest's memory-backed /tmp: a file on the host share would
# measure the share's synchronous write path, not LIO. Sparse, so only written blocks cost RAM.
img=$KL_WORK/lio-lun0.img
truncate -s 1G "$img"
# LIO_BLOCK_SIZE (e.g. 4096): the same LUN with that logical block size. LIO takes a block
# size only before the device is exported, which lio-up.py does at once, so then the same
# steps run here with the size set first.
lio_up() {
    if [ -z "${LIO_BLOCK_SIZE:-}" ]; then
        "$PY" "$LIO_UP" "$img" "$PORT"
        return
    fi
    "$PY" - "$img" "$PORT" "$LIO_BLOCK_SIZE" "$IQN" <<'PY'
import sys
from rtslib_fb import FileIOStorageObject, FabricModule, Target, TPG, LUN, NetworkPortal
path, port, bs, iqn = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
so = FileIOStorageObject('d0', path, size=1 << 30, write_back=False)
so.set_attribute('block_size', bs)
for a in ('emulate_tpu', 'emulate_tpws', 'emulate_caw', 'emulate_3pc'):
    try:
        so.set_attribute(a, '1')
    except Exception as e:
        print('attr', a, e)
tpg = TPG(Target(FabricModule('iscsi'), iqn), 1)
LUN(tpg, 0, so)
NetworkPortal(tpg, '127.0.0.1', port)
for k, v in (('generate_node_acls', '1'), ('demo_mode_write_protect', '0'),
             ('authentication', '0'), ('cache_dynamic_acls', '1')):
    tpg.set_attribute(k, v)
tpg.enable = True
print('LIO up on', port, 'block_size', so.get_attribute('block_size'))
PY
}
if out=$(lio_up 2>&1) && wait_listen "127.0.0.1:$PORT" $$ 30; then
    pass "LIO up: $(tail -n 1 <<<"$out" | tr '\n' ' ')"
else
    fail "LIO setup ($LIO_UP $img $PORT): $(tail -n 5 <<<"$out" | tr '\n' ' ')"
    finish lio-conformance
    exit 1
fi
# What exactly was measured, for the results file's header.
{
    echo "kernel $(uname -r)"
    echo "rtslib-fb $(dpkg-query -W -f '${Version}' python3-rtslib-fb 2>/dev/null)"
    echo "libiscsi-bin $(dpkg-query -W -f '${Version}' libiscsi-bin 2>/dev/null)"
    echo "lio-up.py output: $(tr '\n' ' ' <<<"$out")"
    echo "dbroot $(cat /sys/kernel/config/target/dbroot 2>/dev/null) (pr/ created)"
    for d in /sys/kernel/config/target/core/fileio_*/*/; do
        [ -e "$d/attrib" ] || continue
        echo "backstore $d: $(grep -h -E '^(Fd|fd)' "$d/info" 2>/dev/null | head -1)"
        for a in block_size hw_block_size emulate_tpu emulate_tpws emulate_caw emulate_3pc \
            emulate_write_cache emulate_fua_write unmap_zeroes_data; do
            [ -e "$d/attrib/$a" ] && printf '  %s=%s\n' "$a" "$(cat "$d/attrib/$a")"
        done
    done
} >"$KL_OUT/lio.txt" 2>&1
log "$(grep -c . "$KL_OUT/lio.txt") lines of LIO facts in lio.txt"

if [ -n "${SUITES_FILE:-}" ]; then suites=$(cat "$SUITES_FILE"); else suites=${SUITES:-$(testcu_suites ALL)}; fi
t_all=$SECONDS
for s in $suites; do
    extra=()
    # The second URL enables libiscsi's multipath tests; the same URL is a second session to
    # the same LUN, which is all they need (blockwire's variant run does the same).
    [ "$s" = MultipathIO ] && extra=("$URL")
    t0=$SECONDS
    testcu_run "$URL" "ALL.$s" "$raw" "$SECS" "${extra[@]}" >/dev/null
    echo $((SECONDS - t0)) >"$raw/$s.secs"
    n=$(grep -c . "$raw/$s.res")
    want=$(testcu_tests "ALL.$s" | grep -c .)
    counts=$(awk '{ c[$2]++ } END { for (k in c) printf "%s %d ", tolower(k), c[k] }' "$raw/$s.res")
    if [ "$n" -ge "$want" ] && [ "$want" -gt 0 ]; then
        pass "ALL.$s: $n tests in $((SECONDS - t0)) s: $counts"
    else
        fail "ALL.$s: $n verdict lines for $want listed tests: $counts"
    fi
    # LIO lives in the kernel and cannot die like a daemon, but it can wedge: a portal that no
    # longer accepts would turn every later suite into NOTRUN, so say so where it happened.
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
        fail "LIO's portal stopped accepting after ALL.$s"
        dmesg | tail -n 40 | sed 's/^/    kernel: /'
    fi
done
log "all suites: $((SECONDS - t_all)) s"
dmesg >"$KL_OUT/dmesg-$(date -u +%H%M%S).log" 2>&1 || true
finish lio-conformance
