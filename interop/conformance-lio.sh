#!/usr/bin/env bash
# interop/conformance-lio.sh — LIO (the Linux kernel's iSCSI target) under the same libiscsi
# conformance family as interop/conformance.sh, as a third column next to blockwire and tgtd.
#
# This machine's kernel has no LIO, so it runs in the kernel lab (../shared/kernel-lab/run.sh:
# Debian's 6.12 kernel under QEMU TCG): interop/kernel/guest-lio-conformance.sh brings LIO up
# with ../shared/kernel-lab/lio-up.py (1 GiB fileio LUN 0, 127.0.0.1:3260, open ACL) and runs
# `iscsi-test-cu -d -t ALL.SUITE` once per suite through interop/lib/testcu.sh, the code
# conformance.sh uses, so the verdicts are parsed the same way.
#
#   interop/conformance-lio.sh               run the lab, then merge
#   interop/conformance-lio.sh --no-lab      no lab boot: rebuild conformance-lio.res from the
#                                            raw results already in build/ and merge
#   interop/conformance-lio.sh --merge-only  merge the committed results again (after
#                                            conformance.sh rewrote the table without LIO)
# Order of the three results scripts: conformance.sh, conformance-variants.sh, this one.
#
# Writes:
#   build/kernel-lab/lio-conformance/        the guest's output (guest-TIME-N.log), raw/SUITE.out and
#                                            .res per suite, lio.txt (kernel, backstore
#                                            attributes), dmesg-TIME.log   (not committed)
#   interop/results/conformance-lio.res      one line per test of the ALL family: `ALL.S.T
#                                            RESULT [detail]`, `#` lines about the run; a suite
#                                            without results (guest died or timed out before
#                                            it) has its tests as NOTRUN, never missing
#   interop/results/conformance.md           LIO column, LIO totals row, how LIO was run, and
#                                            a "## LIO (kernel lab)" section; the blockwire and
#                                            tgtd cells are left as they are
#
# Not CI: a results script (about 4 minutes of guest time for the whole family on an idle
# machine, boot included, much longer on a loaded one).
# Env: SUITES="Read10 Inquiry" reruns only those suites (the other suites' results of the
#      previous run are kept; without SUITES the output directory starts empty),
#      LIO_BATCHES=N splits the suites over N lab boots (default 1), SUITE_TIMEOUT seconds per
#      suite in the guest (default 600), KL_TIMEOUT seconds per lab boot (default 3600).
# The lab is shared with other workers: each boot holds /tmp/kernel-lab.lock.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
lab=${KLAB_SHARED:-$repo/../shared}/kernel-lab
export PATH=/opt/kernel-lab/venv/bin:$PATH
. "$here/lib/testcu.sh"

out=${CARGO_TARGET_DIR:-$repo/build}/kernel-lab/lio-conformance
res=$here/results/conformance-lio.res
md=$here/results/conformance.md
case "${1:-}" in
"") mode=run ;;
--no-lab) mode=collect ;;
--merge-only) mode=merge ;;
*) echo "usage: $0 [--no-lab | --merge-only]" >&2; exit 2 ;;
esac

all_suites=$(testcu_suites ALL)
[ -n "$all_suites" ] || { echo "FAIL: iscsi-test-cu --list gives no ALL suites" >&2; exit 1; }

rc_all=0
if [ "$mode" = run ]; then
    if [ ! -x "$lab/run.sh" ] || [ ! -e /opt/kernel-lab/current ]; then
        echo "FAIL: the kernel lab is not set up ($lab/run.sh, /opt/kernel-lab/current):" >&2
        echo "      run $lab/setup.sh as root first" >&2
        exit 1
    fi
    [ -f "$lab/lio-up.py" ] || { echo "FAIL: no $lab/lio-up.py" >&2; exit 1; }
    if [ -z "${SUITES:-}" ]; then rm -rf "$out"; fi
    mkdir -p "$out/raw"
    read -r -a run_suites <<<"$(echo ${SUITES:-$all_suites})"
    batches=${LIO_BATCHES:-1}
    per=$(((${#run_suites[@]} + batches - 1) / batches))
    # A rerun of some suites keeps the earlier boots' logs: each boot's names carry the time.
    tag=$(date -u +%H%M%S)
    for ((b = 0; b * per < ${#run_suites[@]}; b++)); do
        chunk="${run_suites[*]:$((b * per)):$per}"
        log=$out/guest-$tag-$b.log
        # The suite list goes through a file: run.sh's command becomes part of the guest
        # kernel's command line (base64), which a list of 50 suite names overflows.
        echo "$chunk" >"$out/suites-$tag-$b.txt"
        echo "==== lab boot $((b + 1)): ${chunk// /, } (waiting for /tmp/kernel-lab.lock if needed)"
        t0=$SECONDS
        rc=0
        flock "${KL_LOCK:-/tmp/kernel-lab.lock}" env KLAB_CWD="$repo" "$lab/run.sh" --cpus 2 --mem 4G \
            --rw "$out" --timeout "${KL_TIMEOUT:-3600}" -- \
            env KL_OUT="$out" SUITES_FILE="$out/suites-$tag-$b.txt" SUITE_TIMEOUT="${SUITE_TIMEOUT:-600}" \
            LIO_UP="$lab/lio-up.py" "$here/kernel/guest-lio-conformance.sh" 2>&1 |
            tee "$log" || rc=$?
        echo "==== lab boot $((b + 1)): exit $rc after $((SECONDS - t0)) s (lock wait included)"
        [ "$rc" = 0 ] || rc_all=$rc
    done
fi

if [ "$mode" != merge ]; then
    mkdir -p "$out/raw"

    # One line per test of the whole family, in --list order; a suite the guest never
    # finished is there as NOTRUN.
    {
        echo "# LIO under iscsi-test-cu -d -t ALL.SUITE in the kernel lab (interop/conformance-lio.sh)"
        # When the suites ran (a rerun of some suites makes this a range), not when this ran.
        first=$(ls -tr "$out"/raw/*.res 2>/dev/null | head -1)
        last=$(ls -t "$out"/raw/*.res 2>/dev/null | head -1)
        if [ -n "$first" ]; then
            echo "# date: $(date -u -r "$first" '+%Y-%m-%d %H:%M') to $(date -u -r "$last" '+%H:%M UTC')"
        fi
        echo "# kernel: $(sed -n 's/^kernel //p' "$out/lio.txt" 2>/dev/null | head -1)"
        echo "# rtslib-fb: $(sed -n 's/^rtslib-fb //p' "$out/lio.txt" 2>/dev/null | head -1)"
        echo "# dbroot: $(sed -n 's/^dbroot \([^ ]*\).*/\1/p' "$out/lio.txt" 2>/dev/null | head -1)"
        echo "# libiscsi-bin: $(dpkg-query -W -f '${Version}' libiscsi-bin)"
        echo "# suite timeout: ${SUITE_TIMEOUT:-600}"
        total=0
        for s in $all_suites; do
            [ -f "$out/raw/$s.secs" ] && total=$((total + $(cat "$out/raw/$s.secs")))
        done
        echo "# seconds: $total"
        if [ -f "$out/lio.txt" ]; then
            sed -n 's/^  \(.*=.*\)/# backstore attribute: \1/p' "$out/lio.txt"
        fi
        for s in $all_suites; do
            if [ -s "$out/raw/$s.res" ]; then
                cat "$out/raw/$s.res"
            else
                testcu_tests "ALL.$s" | sed "s/^/ALL.$s./; s/\$/ NOTRUN no result: the lab run never finished this suite/"
            fi
        done
    } >"$res.tmp"
    mv "$res.tmp" "$res"
    if [ "$rc_all" != 0 ]; then
        echo "!! a lab boot exited $rc_all: see $out/guest-*.log; its missing suites are NOTRUN"
    fi
fi

[ -f "$res" ] || { echo "FAIL: no $res (run without --merge-only first)" >&2; exit 1; }
[ -f "$md" ] || { echo "FAIL: no $md (run interop/conformance.sh first)" >&2; exit 1; }
python3 "$here/lib/conformance_lio_merge.py" "$md" "$res"
grep -E '^\| (blockwire|tgtd|LIO) \|' "$md"
echo "table: $md"
# The table is written either way (missing suites as NOTRUN), but a failed boot is a failure.
[ "${rc_all:-0}" = 0 ]
