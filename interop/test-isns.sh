#!/bin/bash
# interop/test-isns.sh — blockwire-target registers its targets with an iSNS server (RFC 4171):
# open-isns' isnsd (Debian's open-isns-server) as the server, open-iscsi's iscsiadm
# (-m discovery -t isns, user space, as in lib/peers.sh) and isnsadm as its clients.
#
# Everything runs in a private network namespace (isnsd listens on the fixed port 3205),
# with the portal groups 127.0.0.1:3260 (tag 1) and 127.0.0.2:3260 (tag 2); target A is
# served through both, B through group 2 only. isnsd runs with DefaultDiscoveryDomain = 1
# (without a discovery domain it shows an initiator nothing) and a registration period of
# 10 s.
#
# Cases:
#   registered        iscsiadm lists A on both portals with their tags and B on 127.0.0.2
#                     only: exactly what SendTargets on either portal says
#   blockwire initiator
#                     blockwire's own `iscsiadm -m discovery -t isns` lists the same and
#                     records the three nodes
#   entity            isnsadm lists the entity by its configured name, and A's alias
#   live change       target.add C (group 1) and target.remove B through the control
#                     socket: iscsiadm lists C, no longer B
#   refreshed         13 s later (past the 10 s period) everything is still listed, and
#                     isns.status and the metrics count refreshes
#   server restart    isnsd killed and started again on an empty database: within 15 s the
#                     targets are listed again (the refresh finds the entity gone and
#                     registers it again)
#   section change    [isns] edited and reloaded while serving: a dry run says what the
#                     reload would do and changes nothing; another entity name replaces the
#                     first on the server, no [isns] deregisters, the first comes back
#   shutdown          SIGTERM: the daemon exits 0 and the entity is gone from the server
#   many targets      60 targets (about 16 KiB of registration, more than one isnsd PDU):
#                     one registration in several messages; isnsadm lists all 60 nodes and
#                     120 portal groups with their tags, and blockwire's initiator all 120
#                     portals (isnsd cannot answer the one query for all: it asks one target
#                     at a time)
#   unreachable       a daemon whose server does not answer serves its targets,
#                     isns.status names the server and the refusal, and the metrics count
#                     the failures
#
# Prints PASS/FAIL per case; exits 1 if any case fails. Needs root (unshare -n, -m) and the
# packages open-isns-server, open-isns-utils, open-iscsi, iproute2, prometheus (promtool).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"

for tool in isnsd isnsadm iscsiadm ip unshare promtool; do
    if ! command -v "$tool" >/dev/null; then
        echo "FAIL setup: $tool is not installed (apt-get install open-isns-server open-isns-utils open-iscsi iproute2 prometheus)"
        exit 1
    fi
done

# Enter a private network namespace once, with the release binary resolved outside it.
if [ -z "${BW_ISNS_NETNS:-}" ]; then
    bin=$(blockwire_bin)
    cli=$(blockwire_cli)
    exec timeout 300 unshare -n env BW_ISNS_NETNS=1 BLOCKWIRE_BIN="$bin" BLOCKWIRE_CLI="$cli" bash "$0" "$@"
fi
bin=$BLOCKWIRE_BIN
cli=$BLOCKWIRE_CLI
ip link set lo up
ip addr add 127.0.0.2/8 dev lo

A=iqn.2026-12.io.blockwire:isns-a
B=iqn.2026-12.io.blockwire:isns-b
C=iqn.2026-12.io.blockwire:isns-c
ENTITY=blockwire-isns-test
ENTITY2=blockwire-isns-renamed
tmp=$(mktemp -d /tmp/bw-isns.XXXXXX)
isnsd_pid="" bw_pid="" bw2_pid=""
cleanup() {
    for p in $bw_pid $bw2_pid; do kill -TERM "$p" 2>/dev/null || true; done
    stop_isnsd
    sleep 0.5
    for p in $bw_pid $bw2_pid; do kill -KILL "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

fails=0
report() { # NAME OK DETAIL...
    local name=$1 ok=$2
    shift 2
    if [ "$ok" = 1 ]; then echo "PASS $name $*"; else echo "FAIL $name $*"; fails=$((fails + 1)); fi
}

cat >"$tmp/isnsd.conf" <<EOF
Database = $tmp/db
PIDFile = $tmp/isnsd.pid
ControlSocket = $tmp/isnsctl
DefaultDiscoveryDomain = 1
RegistrationPeriod = 10
SLPRegister = 0
Security = 0
EOF
cat >"$tmp/isnsadm.conf" <<EOF
ServerAddress = 127.0.0.1
Security = 0
EOF

stop_isnsd() {
    [ -n "$isnsd_pid" ] || return 0
    kill -KILL "$isnsd_pid" 2>/dev/null || true
    timeout 5 bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 0.05; done' _ "$isnsd_pid" || true
    isnsd_pid=""
}

start_isnsd() {
    # (A PID file left by a killed isnsd stops the next one.)
    rm -rf "$tmp/db" "$tmp/isnsd.pid"
    mkdir -p "$tmp/db"
    # Started from a subshell: not a job of this shell, which would report its SIGKILL.
    (isnsd -c "$tmp/isnsd.conf" -f >>"$tmp/isnsd.log" 2>&1 </dev/null & echo $! >"$tmp/isnsd.started")
    isnsd_pid=$(cat "$tmp/isnsd.started")
    timeout 10 bash -c 'until (exec 3<>/dev/tcp/127.0.0.1/3205) 2>/dev/null; do sleep 0.1; done' || {
        echo "FAIL setup: isnsd did not listen on 127.0.0.1:3205; its log:"
        tail -n 20 "$tmp/isnsd.log"
        exit 1
    }
}

# config FILE SERVER CONTROL — the two portal groups, targets A and B, [isns].
config() {
    cat >"$1" <<EOF
[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]

[[portal_group]]
tag = 2
listen = ["127.0.0.2:3260"]

[control]
socket = "$3"

[metrics]
listen = "127.0.0.1:9450"

[isns]
server = "$2"
entity = "$ENTITY"

[[target]]
name = "$A"
alias = "disk a"
portal_groups = [1, 2]
[[target.lun]]
id = 0
backstore = "ram"
size = "16M"

[[target]]
name = "$B"
portal_groups = [2]
[[target.lun]]
id = 0
backstore = "ram"
size = "16M"
EOF
}

# start_daemon CONFIG LOG — prints the PID once the control socket answers; LOG.rc gets the
# daemon's exit code when it ends (a wrapper waits for it: the caller runs us in $(...)).
start_daemon() {
    rm -f "$2.pid" "$2.rc"
    (
        "$bin" --config "$1" >"$2" 2>&1 </dev/null &
        p=$!
        echo "$p" >"$2.pid"
        if wait "$p"; then rc=0; else rc=$?; fi
        echo "$rc" >"$2.rc"
    ) >/dev/null 2>&1 </dev/null &
    timeout 5 bash -c 'until [ -s "$1" ]; do sleep 0.05; done' _ "$2.pid" || {
        echo "FAIL setup: blockwire-target did not start" >&2
        exit 1
    }
    local pid sock
    pid=$(cat "$2.pid")
    sock=$(sed -n 's/^socket = "\(.*\)"/\1/p' "$1")
    if ! timeout 20 bash -c 'until [ -S "$1" ]; do kill -0 "$2" || exit 1; sleep 0.05; done' _ "$sock" "$pid"; then
        echo "FAIL setup: blockwire-target did not start; its log:" >&2
        tail -n 20 "$2" >&2
        exit 1
    fi
    echo "$pid"
}

ctl() { "$bin" ctl --control "$tmp/ctl.sock" "$@"; }
# The iSNS listing, sorted, one "ADDR:PORT,TAG IQN" per line (nothing when none is found).
isns_listing() { iscsiadm_discover 127.0.0.1:3205 --isns 2>/dev/null | sort || true; }
# Waits up to $1 s for isns_listing to equal $2; prints the last listing.
wait_listing() {
    local deadline=$((SECONDS + $1)) got
    while :; do
        got=$(isns_listing)
        if [ "$got" = "$2" ] || [ $SECONDS -ge $deadline ]; then
            echo "$got"
            return 0
        fi
        sleep 1
    done
}
# metric NAME — its value on the daemon's metrics endpoint (empty when absent).
metric() {
    python3 - "$1" <<'PY'
import sys, urllib.request
body = urllib.request.urlopen("http://127.0.0.1:9450/metrics", timeout=5).read().decode()
for line in body.splitlines():
    if line.startswith(sys.argv[1] + "{") or line.startswith(sys.argv[1] + " "):
        print(line.rsplit(" ", 1)[1])
        break
PY
}
status_field() { ctl isns.status | python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
oneline() { tr '\n' ' ' <<<"$1"; }

start_isnsd
config "$tmp/target.toml" 127.0.0.1 "$tmp/ctl.sock"
bw_pid=$(start_daemon "$tmp/target.toml" "$tmp/blockwire.log")

# registered: A through both portals, B through 127.0.0.2 only, as SendTargets says.
want=$(printf '%s\n' "127.0.0.1:3260,1 $A" "127.0.0.2:3260,2 $A" "127.0.0.2:3260,2 $B" | sort)
got=$(wait_listing 10 "$want")
st1=$(iscsiadm_discover 127.0.0.1:3260 2>/dev/null | sort || true)
st2=$(iscsiadm_discover 127.0.0.2:3260 2>/dev/null | sort || true)
ok=0
[ "$got" = "$want" ] && [ "$st1" = "$want" ] && [ "$st2" = "$want" ] && ok=1
report registered $ok "iSNS: $(oneline "$got")| SendTargets on 127.0.0.1: $(oneline "$st1")| on 127.0.0.2: $(oneline "$st2")"

# blockwire's initiator: `blockwire iscsiadm -m discovery -t isns` lists what open-iscsi's
# does, and records the nodes.
bw_out=$("$cli" iscsiadm -m discovery -t isns -p 127.0.0.1 --config-dir "$tmp/nodes" 2>"$tmp/cli.err" | sort || true)
records=$(find "$tmp/nodes/nodes" -mindepth 2 -maxdepth 2 -type f 2>/dev/null | wc -l)
ok=0
[ "$bw_out" = "$want" ] && [ "$records" = 3 ] && ok=1
report "blockwire initiator" $ok "($records node records): $(oneline "$bw_out")$(oneline "$(cat "$tmp/cli.err")")"

# entity: the configured Entity Identifier and A's alias on the server.
ents=$(isnsadm -c "$tmp/isnsadm.conf" --list entities 2>/dev/null || true)
nodes=$(isnsadm -c "$tmp/isnsadm.conf" --list nodes 2>/dev/null || true)
ok=0
grep -q "Entity identifier = \"$ENTITY\"" <<<"$ents" && grep -q 'iSCSI alias = "disk a"' <<<"$nodes" && ok=1
report entity $ok "($(grep -c 'iSCSI name' <<<"$nodes") nodes; $(grep 'Entity identifier' <<<"$ents" | tr -s ' ' | tr '\n' ' '))"

# live change: C added on group 1, B removed.
ctl target.add "{\"target\": {\"name\": \"$C\", \"portal_groups\": [1], \"lun\": [{\"id\": 0, \"backstore\": \"ram\", \"size\": \"1M\"}]}}" >/dev/null
ctl target.remove "{\"target\": \"$B\"}" >/dev/null
want=$(printf '%s\n' "127.0.0.1:3260,1 $A" "127.0.0.2:3260,2 $A" "127.0.0.1:3260,1 $C" | sort)
got=$(wait_listing 10 "$want")
ok=0
[ "$got" = "$want" ] && ok=1
report "live change" $ok "$(oneline "$got")"

# refreshed: past the 10 s period, still registered, refreshed at least once.
sleep 13
got=$(isns_listing)
refreshes=$(status_field refreshes)
m_reg=$(metric blockwire_isns_registered)
m_ref=$(metric blockwire_isns_refreshes_total)
# The exposition with the iSNS families is still one promtool accepts.
lint=$(python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9450/metrics", timeout=5).read().decode(), end="")' \
    | promtool check metrics 2>&1) && lint_rc=0 || lint_rc=$?
ok=0
[ "$got" = "$want" ] && [ "$refreshes" -ge 1 ] && [ "$m_reg" = 1 ] && [ "$m_ref" -ge 1 ] && [ "$lint_rc" = 0 ] && ok=1
report refreshed $ok "(refreshes $refreshes, period granted $(status_field period_secs) s; metrics: registered $m_reg, refreshes $m_ref; promtool check metrics: exit $lint_rc $(oneline "$lint")): $(oneline "$got")"
echo "   isns.status: $(ctl isns.status | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin), sort_keys=True))')"

# server restart on an empty database: registered again by the next refresh.
regs_before=$(status_field registrations)
stop_isnsd
start_isnsd
empty=$(isns_listing)
got=$(wait_listing 15 "$want")
regs_after=$(status_field registrations)
ok=0
# (Whether the first listing after the restart is empty depends on how soon the daemon
# noticed: the new registration is what counts.)
[ "$got" = "$want" ] && [ "$regs_after" -gt "$regs_before" ] && ok=1
report "server restart" $ok "(empty right after: $([ -z "$empty" ] && echo yes || echo no); registrations $regs_before -> $regs_after): $(oneline "$got")"

# section change: [isns] changed while the daemon runs (saved, edited, reloaded): another
# entity name, then no [isns], then the first again. A dry run first says what the reload
# would do and changes nothing; each reload ends the old registration (deregistered) and
# starts the new one, without a restart.
ctl config.save >/dev/null
cp "$tmp/target.toml" "$tmp/saved.toml"
sed "s/^entity = \"$ENTITY\"/entity = \"$ENTITY2\"/" "$tmp/saved.toml" >"$tmp/target.toml"
dry=$(ctl --dry-run config.reload 2>&1 || true)
ents_dry=$(isnsadm -c "$tmp/isnsadm.conf" --list entities 2>/dev/null || true)
ctl config.reload >/dev/null
ents2=""
for _ in $(seq 1 50); do
    ents2=$(isnsadm -c "$tmp/isnsadm.conf" --list entities 2>/dev/null || true)
    grep -q "\"$ENTITY2\"" <<<"$ents2" && ! grep -q "\"$ENTITY\"" <<<"$ents2" && break
    sleep 0.2
done
got2=$(wait_listing 10 "$want")
python3 - "$tmp/saved.toml" "$tmp/target.toml" <<'PY'
import sys
lines, out, skip = open(sys.argv[1]).read().splitlines(), [], False
for l in lines:
    if l.startswith("["):
        skip = l.strip() == "[isns]"
    if not skip:
        out.append(l)
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
ctl config.reload >/dev/null
gone=$(wait_listing 10 "")
status_rc=0
ctl isns.status >/dev/null 2>&1 || status_rc=$?
cp "$tmp/saved.toml" "$tmp/target.toml"
ctl config.reload >/dev/null
back=$(wait_listing 10 "$want")
ok=0
grep -q "iSNS: entity $ENTITY deregistered from 127.0.0.1:3205" <<<"$dry" \
    && grep -q "iSNS: registering the targets with 127.0.0.1:3205 as entity $ENTITY2" <<<"$dry" \
    && grep -q '"dry_run": true' <<<"$dry" && grep -q "\"$ENTITY\"" <<<"$ents_dry" \
    && grep -q "\"$ENTITY2\"" <<<"$ents2" && ! grep -q "\"$ENTITY\"" <<<"$ents2" \
    && [ "$got2" = "$want" ] && [ -z "$gone" ] && [ "$status_rc" != 0 ] && [ "$back" = "$want" ] && ok=1
report "section change" $ok "(dry run: $(grep -c 'iSNS:' <<<"$dry") iSNS lines, entity before it $(grep -o "\"$ENTITY\"" <<<"$ents_dry" | head -1); renamed: $(grep 'Entity identifier' <<<"$ents2" | tr -s ' ' | tr '\n' ' '); without [isns]: listing '$(oneline "$gone")', isns.status exit $status_rc; restored: $(oneline "$back"))"

# shutdown: a clean exit deregisters the entity.
kill -TERM "$bw_pid"
rc=timeout
if timeout 20 bash -c 'until [ -s "$1" ]; do sleep 0.1; done' _ "$tmp/blockwire.log.rc"; then
    rc=$(cat "$tmp/blockwire.log.rc")
    bw_pid=""
fi
got=$(isns_listing)
ents=$(isnsadm -c "$tmp/isnsadm.conf" --list entities 2>/dev/null || true)
ok=0
[ "$rc" = 0 ] && [ -z "$got" ] && ! grep -q "$ENTITY" <<<"$ents" && ok=1
report shutdown $ok "(exit $rc; listing after: '$(oneline "$got")'; deregistered: $(grep -q "$ENTITY" <<<"$ents" && echo no || echo yes))"

# many targets: 60 targets on both groups, about 16 KiB of registration, more than isnsd
# takes in one PDU (8 KiB): it goes in several messages, and the server holds every node and
# all 120 portal groups with their tags. (isnsadm lists them one object per message; isnsd
# answers a query in one PDU, so iscsiadm's single query for all targets gets Internal
# Error once its answer passes 8 KiB, whoever registered them: printed, not checked.
# blockwire's initiator then asks one target at a time: checked.)
{
    echo '[[portal_group]]'; echo 'tag = 1'; echo 'listen = ["127.0.0.1:3260"]'
    echo '[[portal_group]]'; echo 'tag = 2'; echo 'listen = ["127.0.0.2:3260"]'
    echo '[control]'; echo "socket = \"$tmp/ctl.sock\""
    echo '[isns]'; echo 'server = "127.0.0.1"'; echo 'entity = "blockwire-isns-many"'
    for i in $(seq 1 60); do
        echo '[[target]]'; echo "name = \"iqn.2026-12.io.blockwire:many-$i\""
        echo '[[target.lun]]'; echo 'id = 0'; echo 'backstore = "null"'; echo 'size = "1M"'
    done
} >"$tmp/many.toml"
bw_pid=$(start_daemon "$tmp/many.toml" "$tmp/blockwire-many.log")
timeout 10 bash -c 'until "$1" ctl --control "$2" isns.status | grep -q "\"registered\""; do sleep 0.2; done' \
    _ "$bin" "$tmp/ctl.sock" || true
regs=$(status_field registrations)
nodes=$(isnsadm -c "$tmp/isnsadm.conf" --list nodes 2>/dev/null | grep -c 'iSCSI name = "iqn.2026-12.io.blockwire:many-' || true)
pgs=$(isnsadm -c "$tmp/isnsadm.conf" --list portal-groups 2>/dev/null || true)
tag1=$(grep -c 'Portal group tag = 1$' <<<"$pgs" || true)
tag2=$(grep -c 'Portal group tag = 2$' <<<"$pgs" || true)
# blockwire's initiator, refused the one query, asks one target at a time.
bw_many=$("$cli" iscsiadm -m discovery -t isns -p 127.0.0.1 --config-dir "$tmp/nodes-many" 2>"$tmp/cli-many.err" | sort || true)
want_many=$(for i in $(seq 1 60); do
    echo "127.0.0.1:3260,1 iqn.2026-12.io.blockwire:many-$i"
    echo "127.0.0.2:3260,2 iqn.2026-12.io.blockwire:many-$i"
done | sort)
ok=0
[ "$regs" = 1 ] && [ "$nodes" = 60 ] && [ "$tag1" = 60 ] && [ "$tag2" = 60 ] && [ "$bw_many" = "$want_many" ] && ok=1
report "many targets" $ok "(registrations $regs; isnsadm: $nodes target nodes, $tag1 portal groups tagged 1, $tag2 tagged 2; blockwire iscsiadm -t isns: $(grep -c . <<<"$bw_many") of 120 portals$(tr '\n' ' ' <"$tmp/cli-many.err" | cut -c1-200); iscsiadm -t isns: $(iscsiadm_discover 127.0.0.1:3205 --isns 2>&1 | grep -c ',[12] iqn') portals, $(iscsiadm_discover 127.0.0.1:3205 --isns 2>&1 | grep -o 'discovery failed: [A-Za-z ]*' | head -n 1))"
kill -TERM "$bw_pid"
timeout 20 bash -c 'until [ -s "$1" ]; do sleep 0.1; done' _ "$tmp/blockwire-many.log.rc" && bw_pid=""

# unreachable: nothing listens on 127.0.0.1:3206; the daemon serves and says why.
stop_isnsd
config "$tmp/target2.toml" 127.0.0.1:3206 "$tmp/ctl.sock"
bw2_pid=$(start_daemon "$tmp/target2.toml" "$tmp/blockwire2.log")
sleep 2
st=$(iscsiadm_discover 127.0.0.2:3260 2>/dev/null | sort || true)
state=$(status_field state)
err=$(status_field last_error)
m_reg=$(metric blockwire_isns_registered)
m_fail=$(metric blockwire_isns_failures_total)
ok=0
[ -n "$st" ] && [ "$state" = waiting ] && grep -q "127.0.0.1:3206" <<<"$err" && grep -qi "refused" <<<"$err" \
    && [ "$m_reg" = 0 ] && [ "$m_fail" -ge 1 ] && ok=1
report unreachable $ok "(state $state, last_error: $err; metrics: registered $m_reg, failures $m_fail; SendTargets: $(oneline "$st"))"

echo "== $([ $fails = 0 ] && echo "all passed" || echo "$fails FAILED")"
[ "$fails" = 0 ]
