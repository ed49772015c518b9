#!/bin/bash
# interop/test-target-libiscsi.sh — libiscsi (Debian's 1.19) against blockwire-target.
#
# 1. The libiscsi tools, each output checked for what it must contain:
#      iscsi-ls -s               the target name, portal and LUN 0 with its size
#      iscsi-inq                 standard INQUIRY: vendor BLOCKWIR, DIRECT_ACCESS
#      iscsi-inq -e 1 -c 128     VPD 0x80 unit serial number (iscsi-inq's -c is decimal:
#                                "0x80" would be read as page 0)
#      iscsi-inq -e 1 -c 131     VPD 0x83 device identification naming the target
#      iscsi-readcapacity16      block length 512 and the LUN's total size
# 2. iscsi-test-cu, one process per suite under timeout, writes allowed (-d), for the suites
#    a SCSI block device must pass; PASSED/FAILED/SKIPPED counted per test (skips are not passes).
#    Any FAILED/ABORTED/NOTRUN test in these suites fails the script; each failing test is
#    rerun with -V and its log is kept (path printed) for diagnosis.
# 3. SIGTERM ends the daemon with exit code 0 (a clean shutdown: systemd's stop and a shell's kill both send it).
#
# Needs: libiscsi-bin, python3; builds the release daemon if missing (lib/blockwire.sh).
# Env: KEEP=1 keeps the scratch directory; SUITES="Read10 Write10" overrides the suite list.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"
. "$here/lib/testcu.sh"

IQN=iqn.2026-11.io.blockwire:libiscsi-test
SIZE=1G
SIZE_BYTES=1073741824
SUITES=${SUITES:-"iSCSIcmdsn iSCSIdatasn iSCSIResiduals iSCSITMF Read10 Read16 Write10 Write16 ReadCapacity16 Inquiry TestUnitReady"}

tmp=$(mktemp -d /dev/shm/bw-libiscsi.XXXXXX)
pid=""
cleanup() {
    if [ -n "$pid" ]; then stop_blockwire "$pid" || true; fi
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

port=$(free_port)
# ACL: exactly the two initiator names iscsi-test-cu uses, plus the names of the tools.
blockwire_config_file "$tmp/target.toml" "$IQN" "$SIZE" \
    "$LIBISCSI_TEST_INITIATOR" "$LIBISCSI_TEST_INITIATOR2" \
    iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-ls \
    iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-inq \
    iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-readcapacity16
pid=$(start_blockwire "$port" "$tmp" "$tmp/target.toml")
URL="iscsi://127.0.0.1:$port/$IQN/0"

fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

# check NAME FILE REGEX... — every extended regex must match some line of FILE.
check() {
    local name=$1 file=$2 re missing=""
    shift 2
    for re in "$@"; do
        grep -Eq -- "$re" "$file" || missing+=" /$re/"
    done
    if [ -z "$missing" ]; then
        pass "$name"
    else
        fail "$name: missing$missing; output:"
        sed 's/^/    | /' "$file" | head -n 40
    fi
}

# tool NAME CMD... — run a libiscsi tool (bounded) into $tmp/NAME.txt; a non-zero exit fails.
tool() {
    local name=$1 rc=0
    shift
    timeout 20 "$@" >"$tmp/$name.txt" 2>&1 || rc=$?
    if [ $rc != 0 ]; then
        fail "$name: exit $rc"
        sed 's/^/    | /' "$tmp/$name.txt" | head -n 20
        return 1
    fi
}

echo "== libiscsi tools against blockwire on 127.0.0.1:$port"
if tool iscsi-ls iscsi-ls -s "iscsi://127.0.0.1:$port"; then
    check "iscsi-ls -s" "$tmp/iscsi-ls.txt" \
        "^Target:$IQN Portal:127\.0\.0\.1:$port,1\$" \
        "^Lun:0 +Type:DIRECT_ACCESS \(Size:1023M\)"
fi
if tool iscsi-inq iscsi-inq "$URL"; then
    check "iscsi-inq (standard)" "$tmp/iscsi-inq.txt" \
        "^Peripheral Device Type:DIRECT_ACCESS" "^Vendor:BLOCKWIR" "^Product:." \
        "^Revision:." "^ReponseDataFormat:2"
fi
if tool iscsi-inq-80 iscsi-inq -e 1 -c 128 "$URL"; then
    check "iscsi-inq -e 1 -c 0x80 (unit serial number)" "$tmp/iscsi-inq-80.txt" \
        "^Unit Serial Number:\[[[:print:]]+\]"
fi
if tool iscsi-inq-83 iscsi-inq -e 1 -c 131 "$URL"; then
    check "iscsi-inq -e 1 -c 0x83 (device identification)" "$tmp/iscsi-inq-83.txt" \
        "^Page Code:\(0x83\) DEVICE_IDENTIFICATION" \
        "^Designator:\[$IQN\]" \
        "Association:\(0\) LOGICAL_UNIT"
fi
if tool iscsi-readcapacity16 iscsi-readcapacity16 "$URL"; then
    check "iscsi-readcapacity16" "$tmp/iscsi-readcapacity16.txt" \
        "^RETURNED LOGICAL BLOCK ADDRESS:$((SIZE_BYTES / 512 - 1))\$" \
        "^LOGICAL BLOCK LENGTH IN BYTES:512\$" \
        "^Total size:$SIZE_BYTES\$"
fi

echo "== iscsi-test-cu suites against blockwire ($URL)"
: >"$tmp/all.res"
for s in $SUITES; do
    testcu_run "$URL" "ALL.$s" "$tmp/cu" 180 >>"$tmp/all.res"
    # Stop early if the daemon died: every later suite would fail for the same reason.
    if ! kill -0 "$pid" 2>/dev/null; then
        fail "blockwire-target died during ALL.$s; log tail:"
        tail -n 30 "$tmp/blockwire-$port.log" | sed 's/^/    | /'
        pid=""
        break
    fi
done
printf '%-16s %6s %6s %6s %6s\n' suite passed failed skipped other
for s in $SUITES; do
    awk -v s="ALL.$s." 'index($1, s) == 1 { n[$2]++ }
        END { printf "%-16s %6d %6d %6d %6d\n", substr(s, 5, length(s) - 5),
              n["PASSED"], n["FAILED"], n["SKIPPED"], n["ABORTED"] + n["NOTRUN"] }' \
        "$tmp/all.res"
done
bad=$(awk '$2 != "PASSED" && $2 != "SKIPPED"' "$tmp/all.res")
if [ -z "$bad" ]; then
    pass "iscsi-test-cu: $(wc -l <"$tmp/all.res") tests, none failed ($(grep -c ' SKIPPED' "$tmp/all.res" || true) skipped)"
else
    fail "iscsi-test-cu: $(wc -l <<<"$bad") tests did not pass:"
    sed 's/^/    /' <<<"$bad"
    # -V logs (every CDB and answer) of the failing tests, for the findings.
    if [ -n "$pid" ]; then
        mkdir -p "$tmp/verbose"
        while read -r t _; do
            testcu_verbose "$URL" "$t" "$tmp/verbose/$t.log" 60
        done <<<"$bad"
        echo "    verbose logs: $tmp/verbose (set KEEP=1 to keep them)"
    fi
fi

echo "== shutdown"
if [ -n "$pid" ]; then
    rc=0
    stop_blockwire "$pid" 2>"$tmp/stop.txt" || rc=$?
    pid=""
    if [ $rc = 0 ]; then pass "SIGTERM: exit code 0"; else fail "SIGTERM: exit code $rc"; fi
fi

echo "== $([ $fails = 0 ] && echo "all passed" || echo "$fails FAILED")"
[ $fails = 0 ]
