# shellcheck shell=bash
# interop/lib/testcu.sh — run libiscsi's iscsi-test-cu one suite per process and count
# PASSED / FAILED / SKIPPED per test (CUnit counts skips as passes; we do not).
#
#   testcu_tests FAMILY.SUITE            print the suite's test names (from --list)
#   testcu_suites FAMILY                 print the suite names of a family (e.g. ALL)
#   testcu_run URL FAMILY.SUITE DIR [SECONDS] [extra iscsi-test-cu args...]
#       run `iscsi-test-cu -d -t FAMILY.SUITE URL` under `timeout SECONDS` (default 120)
#       with line-buffered stdout; raw output to DIR/SUITE.out, one line per test
#       `FAMILY.SUITE.TEST RESULT [detail]` to DIR/SUITE.res (and stdout). Returns 0.
#   testcu_verbose URL FAMILY.SUITE.TEST FILE [SECONDS]
#       rerun one test with -V (every SCSI command and its answer) into FILE
#
# The ACL of the target under test must allow both initiator names iscsi-test-cu uses
# ($LIBISCSI_TEST_INITIATOR and $LIBISCSI_TEST_INITIATOR2 in blockwire.sh).

_tcu_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The --list output, cached once per shell.
_tcu_list() {
    if [ -z "${_TCU_LIST:-}" ]; then
        _TCU_LIST=$(iscsi-test-cu --list 2>/dev/null)
    fi
    printf '%s\n' "$_TCU_LIST"
}

testcu_suites() {
    _tcu_list | awk -F. -v f="$1" 'NF == 2 && $1 == f { print $2 }'
}

testcu_tests() {
    local fam=${1%%.*} suite=${1#*.}
    _tcu_list | awk -F. -v f="$fam" -v s="$suite" 'NF == 3 && $1 == f && $2 == s { print $3 }'
}

testcu_run() {
    local url=$1 fs=$2 dir=$3 secs=${4:-120}
    shift 4 2>/dev/null || shift $#
    local suite=${fs#*.} rc=0
    mkdir -p "$dir"
    # -d: allow the destructive (write) tests; -v: one line per test (the default mode).
    timeout -k 5 "$secs" stdbuf -oL -eL iscsi-test-cu -d -v "$@" -t "$fs" "$url" \
        >"$dir/$suite.out" 2>&1 </dev/null || rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "    [TIMEOUT] iscsi-test-cu killed after $secs s" >>"$dir/$suite.out"
    fi
    # shellcheck disable=SC2046
    python3 "$_tcu_dir/testcu_parse.py" "$dir/$suite.out" "$fs" $(testcu_tests "$fs") \
        | tee "$dir/$suite.res"
    return 0
}

testcu_verbose() {
    local url=$1 t=$2 file=$3 secs=${4:-60}
    timeout -k 5 "$secs" stdbuf -oL -eL iscsi-test-cu -d -V -t "$t" "$url" \
        >"$file" 2>&1 </dev/null || true
}
