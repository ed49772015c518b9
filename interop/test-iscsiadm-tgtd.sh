#!/bin/bash
# interop/test-iscsiadm-tgtd.sh — proves interop/lib/peers.sh's iscsiadm_discover against tgtd:
# SendTargets discovery with no auth, one-way CHAP, mutual CHAP, a wrong secret (exit 24)
# and a wrong mutual-CHAP target secret (exit 19).
# Each case gets its own tgtd on a free port. Prints PASS/FAIL per case; exits 1 if any fails.
# Needs root (unshare -m, mounts) and the packages tgt + open-iscsi.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/peers.sh"

IQN=iqn.2026-11.io.blockwire:disc
tmp=$(mktemp -d /dev/shm/bw-iscsiadm.XXXXXX)
pid=""
cleanup() { stop_tgtd "${port:-}" "$pid"; rm -rf "$tmp"; }
trap cleanup EXIT

fails=0
# run_case NAME EXPECTED_RC CHAP_SETUP... -- DISCOVER_ARGS...
#   CHAP_SETUP is one of: none | chap | mutual
run_case() {
    local name=$1 want_rc=$2 setup=$3
    shift 3
    local out rc=0
    port=$(free_port)
    pid=$(start_tgtd "$port" "$tmp")
    tgtd_new_target "$port" 1 "$IQN"
    tgtd_add_lun "$port" 1 1 "$tmp/lun-$port.img" 8
    case $setup in
        chap) tgtd_chap "$port" in alice alicesecret12 ;;
        mutual) tgtd_chap "$port" in alice alicesecret12
                tgtd_chap "$port" out target targetsecret34 ;;
    esac
    out=$(iscsiadm_discover "127.0.0.1:$port" "$@" 2>"$tmp/err-$name") || rc=$?
    stop_tgtd "$port" "$pid"; pid=""
    local ok=1
    [ "$rc" = "$want_rc" ] || ok=0
    if [ "$want_rc" = 0 ]; then
        grep -qx "127.0.0.1:$port,1 $IQN" <<<"$out" || ok=0
    fi
    if [ $ok = 1 ]; then
        echo "PASS $name (exit $rc) ${out:+: $out}"
    else
        echo "FAIL $name (exit $rc, want $want_rc): $out"
        sed 's/^/    stderr: /' "$tmp/err-$name"
        fails=$((fails + 1))
    fi
}

run_case no-auth 0 none
run_case one-way-chap 0 chap --chap alice alicesecret12
run_case mutual-chap 0 mutual --chap alice alicesecret12 --mutual target targetsecret34
run_case wrong-secret 24 chap --chap alice wrongsecret99
# Bonus: the initiator expects a different target secret -> iscsiadm exits 19.
run_case wrong-mutual-secret 19 mutual --chap alice alicesecret12 --mutual target wrongsecret77
[ $fails = 0 ]
