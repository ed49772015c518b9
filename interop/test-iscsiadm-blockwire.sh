#!/bin/bash
# interop/test-iscsiadm-blockwire.sh — SendTargets discovery against blockwire-target with
# open-iscsi's iscsiadm (user-space discovery without the kernel: lib/peers.sh
# iscsiadm_discover) and with libiscsi's iscsi-ls.
#
# Cases (each with its own daemon and config on a free port):
#   iscsiadm no-auth              listing = "127.0.0.1:PORT,1 IQN"
#   iscsiadm one-way CHAP         [discovery] chap
#   iscsiadm mutual CHAP          [discovery] chap + mutual_chap; iscsiadm checks the target
#   iscsiadm wrong secret         exit 24 (authorization failure), nothing listed
#   iscsiadm wrong mutual secret  the target proves itself with a secret iscsiadm does not
#                                 expect: exit 19
#   iscsiadm ACL                  two targets: the first allows iscsiadm's (and iscsi-ls's)
#                                 initiator name, the second only another one: only the
#                                 first is listed
#   iscsi-ls no-auth / CHAP / wrong CHAP secret (libiscsi URL user%secret@; wrong = non-zero
#   exit, no target listed)
#
# Prints PASS/FAIL per case; exits 1 if any case fails. Needs root (unshare -m, mounts) and
# the packages open-iscsi + libiscsi-bin.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"

IQN=iqn.2026-11.io.blockwire:disc
IQN2=iqn.2026-11.io.blockwire:hidden
# iscsiadm_discover logs in as this initiator (lib/peers.sh).
ISCSIADM_INITIATOR=iqn.2026-11.io.blockwire:iscsiadm-test
ISCSI_LS_INITIATOR=iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-ls
# CHAP secrets: 12..255 characters; the mutual one differs from the initiator's.
USER=alice SECRET=alice-secret-12
TUSER=target TSECRET=target-secret-34

tmp=$(mktemp -d /dev/shm/bw-iscsiadm.XXXXXX)
pid=""
cleanup() {
    if [ -n "$pid" ]; then stop_blockwire "$pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# config FILE none|chap|mutual|acl — one target (two for acl), discovery auth as asked.
config() {
    local file=$1 kind=$2
    {
        echo '[[portal_group]]'
        echo 'tag = 1'
        echo 'listen = ["127.0.0.1:3260"]'
        case $kind in
            chap)
                echo '[discovery]'
                echo "chap = [{ user = \"$USER\", secret = \"$SECRET\" }]" ;;
            mutual)
                echo '[discovery]'
                echo "chap = [{ user = \"$USER\", secret = \"$SECRET\" }]"
                echo "mutual_chap = { user = \"$TUSER\", secret = \"$TSECRET\" }" ;;
        esac
        echo '[[target]]'
        echo "name = \"$IQN\""
        # For the ACL case the visible target lists its initiators explicitly too.
        [ "$kind" != acl ] ||
            echo "allow = [\"$ISCSIADM_INITIATOR\", \"$ISCSI_LS_INITIATOR\"]"
        echo '[[target.lun]]'
        echo 'id = 0'
        echo 'backstore = "ram"'
        echo 'size = "16M"'
        if [ "$kind" = acl ]; then
            echo '[[target]]'
            echo "name = \"$IQN2\""
            echo 'allow = ["iqn.2026-11.io.blockwire:someone-else"]'
            echo '[[target.lun]]'
            echo 'id = 0'
            echo 'backstore = "ram"'
            echo 'size = "16M"'
        fi
    } >"$file"
}

fails=0
report() { # report NAME OK DETAIL...
    local name=$1 ok=$2
    shift 2
    if [ "$ok" = 1 ]; then echo "PASS $name $*"; else echo "FAIL $name $*"; fails=$((fails + 1)); fi
}

# start KIND — a daemon with config KIND on a fresh port; sets $port and $pid.
start() {
    port=$(free_port)
    config "$tmp/$1.toml" "$1"
    pid=$(start_blockwire "$port" "$tmp" "$tmp/$1.toml")
}
stop() {
    stop_blockwire "$pid" 2>/dev/null || true
    pid=""
}

# iscsiadm_case NAME KIND WANT_RC WANT_LISTING [discover args...]
#   WANT_LISTING: the exact expected stdout lines ("" = none)
iscsiadm_case() {
    local name=$1 kind=$2 want_rc=$3 want=$4
    shift 4
    local out rc=0 ok=1
    start "$kind"
    out=$(iscsiadm_discover "127.0.0.1:$port" "$@" 2>"$tmp/err") || rc=$?
    stop
    [ "$rc" = "$want_rc" ] || ok=0
    # Compare the sorted listing (iscsiadm prints one "HOST:PORT,TPGT IQN" line per portal).
    want=${want//PORT/$port}
    [ "$(sort <<<"$out")" = "$(sort <<<"$want")" ] || ok=0
    report "iscsiadm $name" $ok "(exit $rc, want $want_rc)${out:+: $(tr '\n' ' ' <<<"$out")}"
    if [ $ok = 0 ]; then
        echo "    want listing: ${want:-<none>}"
        grep -v -e iscsid -e systemd "$tmp/err" | sed 's/^/    stderr: /' | head -n 10 || true
        tail -n 15 "$tmp/blockwire-$port.log" | sed 's/^/    daemon: /'
    fi
}

iscsiadm_case no-auth none 0 "127.0.0.1:PORT,1 $IQN"
iscsiadm_case one-way-chap chap 0 "127.0.0.1:PORT,1 $IQN" --chap "$USER" "$SECRET"
iscsiadm_case mutual-chap mutual 0 "127.0.0.1:PORT,1 $IQN" \
    --chap "$USER" "$SECRET" --mutual "$TUSER" "$TSECRET"
iscsiadm_case wrong-secret chap 24 "" --chap "$USER" wrong-secret-99
iscsiadm_case no-credentials-when-chap-required chap 24 ""
iscsiadm_case wrong-mutual-secret mutual 19 "" \
    --chap "$USER" "$SECRET" --mutual "$TUSER" wrong-target-secret
iscsiadm_case acl-hides-target acl 0 "127.0.0.1:PORT,1 $IQN"

# iscsi-ls cases. iscsi-ls -s logs in to every target it finds (to list LUNs), so plain
# `iscsi-ls URL` (discovery only) is used; its lines are "Target:IQN Portal:HOST:PORT,TPGT".
# ls_case NAME KIND WANT_RC URL_USERINFO
ls_case() {
    local name=$1 kind=$2 want_ok=$3 userinfo=$4 out rc=0 ok=1
    start "$kind"
    out=$(timeout 20 iscsi-ls "iscsi://${userinfo}127.0.0.1:$port" 2>&1) || rc=$?
    stop
    if [ "$want_ok" = 1 ]; then
        [ $rc = 0 ] || ok=0
        grep -qx "Target:$IQN Portal:127.0.0.1:$port,1" <<<"$out" || ok=0
    else
        [ $rc != 0 ] || ok=0
        ! grep -q "^Target:" <<<"$out" || ok=0
    fi
    report "iscsi-ls $name" $ok "(exit $rc): $(tr '\n' ' ' <<<"$out" | cut -c1-160)"
}
ls_case no-auth none 1 ""
ls_case one-way-chap chap 1 "$USER%$SECRET@"
ls_case wrong-secret chap 0 "$USER%wrong-secret-99@"
ls_case acl-hides-target acl 1 ""

echo "== $([ $fails = 0 ] && echo "all passed" || echo "$fails FAILED")"
[ $fails = 0 ]
