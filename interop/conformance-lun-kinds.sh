#!/bin/bash
# interop/conformance-lun-kinds.sh — libiscsi's whole ALL family (CI's run:
# interop/test-conformance-all.sh, iscsi-test-cu -d -S, MultipathIO with a second URL) once for
# each kind of LUN 0: RAM, a page-cache file, an O_DIRECT file, a RAM LUN with 4 KiB blocks, a
# loop device (a block device LUN) and a file LUN with T10 protection information (Type 1).
# Each run must end with 0 tests not passed; the summary lines and skip lists go to stdout and to
# interop/results/conformance-lun-kinds.txt.
#
# Not run by CI (six whole runs take about 36 minutes; CI runs the RAM kind). Uses the release
# build of blockwire-target.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/results/conformance-lun-kinds.txt
kinds=${KINDS:-ram file direct 4k blockdev pi}
{
    echo "# libiscsi ALL family per kind of LUN 0 (interop/conformance-lun-kinds.sh)"
    echo
    echo "$(date -u +%F) on $(nproc) cores, $(uname -r), libiscsi-bin $(dpkg-query -W -f '${Version}' libiscsi-bin 2>/dev/null),"
    echo "blockwire at $(git -C "$here/.." rev-parse --short HEAD)${BENCH_NOTE:+; $BENCH_NOTE}"
    echo
} >"$out"
failed=()
for k in $kinds; do
    log=$(mktemp)
    LUN0_KIND=$k "$here/test-conformance-all.sh" >"$log" 2>&1
    rc=$?
    {
        grep -E "^(== iscsi-test-cu|ALL family|  skipped:|FAIL|  ALL\.)" "$log"
        echo "exit $rc"
        echo
    } | tee -a "$out"
    [ "$rc" = 0 ] || failed+=("$k")
    rm -f "$log"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAIL: LUN kinds with failures: ${failed[*]}"
    exit 1
fi
echo "PASS: every kind of LUN 0 ($kinds): 0 not passed"
