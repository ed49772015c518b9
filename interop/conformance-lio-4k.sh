#!/usr/bin/env bash
# interop/conformance-lio-4k.sh — the libiscsi tests blockwire fails on a LUN with 4096-byte
# logical blocks (interop/results/conformance-lun-kinds.txt), run against LIO with the same block
# size in the kernel lab, to tell a target's fault from the test tool's 512-byte assumptions.
#
# One lab boot: interop/kernel/guest-lio-conformance.sh with LIO_BLOCK_SIZE=4096 (a 1 GiB fileio
# LUN as for the LIO column of conformance.md, logical block size set before the LUN is
# exported) and the suites in SUITES (default: ProutReserve WriteSame16, where the 4 KiB
# failures are), one `iscsi-test-cu -d -t ALL.SUITE` per suite through interop/lib/testcu.sh.
# Prints every test's verdict and writes them with the LIO facts to
# interop/results/conformance-lio-4k.txt.
#
# Not CI: a results script (one lab boot, a few minutes on an idle machine).
# The lab is shared with other workers: the boot holds /tmp/kernel-lab.lock.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
lab=${KLAB_SHARED:-$repo/../shared}/kernel-lab
export PATH=/opt/kernel-lab/venv/bin:$PATH

if [ ! -x "$lab/run.sh" ] || [ ! -e /opt/kernel-lab/current ]; then
    echo "FAIL: the kernel lab is not set up ($lab/run.sh, /opt/kernel-lab/current):" >&2
    echo "      run $lab/setup.sh as root first" >&2
    exit 1
fi
SUITES=${SUITES:-ProutReserve WriteSame16}
out=${CARGO_TARGET_DIR:-$repo/build}/kernel-lab/lio-conformance-4k
rm -rf "$out"
mkdir -p "$out/raw"
echo "$SUITES" >"$out/suites.txt"
rc=0
flock "${KL_LOCK:-/tmp/kernel-lab.lock}" env KLAB_CWD="$repo" "$lab/run.sh" --cpus 2 --mem 4G \
    --rw "$out" --timeout "${KL_TIMEOUT:-1800}" -- \
    env KL_OUT="$out" SUITES_FILE="$out/suites.txt" SUITE_TIMEOUT="${SUITE_TIMEOUT:-600}" \
    LIO_UP="$lab/lio-up.py" LIO_BLOCK_SIZE=4096 "$here/kernel/guest-lio-conformance.sh" 2>&1 |
    tee "$out/guest.log" || rc=$?

res=$here/results/conformance-lio-4k.txt
{
    echo "# LIO with 4096-byte logical blocks under iscsi-test-cu (interop/conformance-lio-4k.sh)"
    echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'); lab boot exit $rc"
    sed 's/^/# /' "$out/lio.txt" 2>/dev/null || echo "# (no lio.txt: LIO did not come up)"
    for s in $SUITES; do
        if [ -s "$out/raw/$s.res" ]; then
            cat "$out/raw/$s.res"
        else
            echo "ALL.$s NOTRUN no result from the lab"
        fi
    done
} >"$res"
grep -v '^#' "$res"
echo "$(grep -c ' PASSED' "$res") passed, $(grep -c ' FAILED' "$res") failed, $(grep -c ' SKIPPED' "$res") skipped: $res"
[ "$rc" = 0 ]
