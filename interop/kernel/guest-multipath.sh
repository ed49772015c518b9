#!/usr/bin/env bash
# interop/kernel/guest-multipath.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# One blockwire target reachable through two portal groups (two target port groups for ALUA:
# group 1 active/optimized on 127.0.0.1:3260, group 2 active/non-optimized on 127.0.0.2:3260).
# open-iscsi logs in through both; scsi_dh_alua reads REPORT TARGET PORT GROUPS; dm-multipath
# (prio alua, path_grouping_policy group_by_prio) builds one map with two path groups. While fio
# writes and verifies through the map, portal group 1 goes away (the daemon's control socket:
# portal.close cuts its connections and closes its listener): I/O moves to group 2 and fio sees
# no error. `multipath -ll` before and after; the metrics count the host's sessions (paths), 2
# then 1. Before that, a planned drain: a reload puts group 1 in ALUA standby (the sessions hear
# ASYMMETRIC ACCESS STATE CHANGED) and multipath moves I/O to group 2 under fio verify, then
# back when group 1 is active/optimized again.
# Then explicit ALUA, an active/passive pair: a target that allows SET TARGET PORT GROUPS, group 1
# active/optimized, group 2 in standby. When group 1 goes away under fio verify, dm-multipath
# switches to group 2 and scsi_dh_alua asks the target with SET TARGET PORT GROUPS to make it
# active; the target does, I/O goes on with no error, and the running configuration says so.
# Then the daemon restarts: the state the host set comes back from [fabric] state_dir (group 2
# active/optimized, its REPORT TARGET PORT GROUPS status "set by SET TARGET PORT GROUPS"), and
# the map reads through it.
# Env: KL_OUT (results dir shared with the host), KL_FIO_MIB (fio size, default 256).
. "$(dirname "$0")/lib.sh"

MIB=${KL_FIO_MIB:-256}
PFX=iqn.2026-11.io.blockwire
IQN=$PFX:lab-mpath
CTL=$KL_WORK/control.sock
METRICS=127.0.0.1:9450
export KL_INITIATOR=iqn.2026-11.lab:kernel-guest
lab_up || { fail "lab-up"; finish multipath; exit 1; }
modprobe -a dm_multipath dm_round_robin scsi_dh_alua || { fail "modprobe multipath modules"; finish multipath; exit 1; }
ip addr add 127.0.0.2/8 dev lo 2>/dev/null || true

# config_with STATE [STATE2 [EXPLICIT]]: the daemon's configuration with portal group 1 in ALUA
# state STATE, group 2 in STATE2 (default active/non-optimized), explicit ALUA true or false.
config_with() {
    cat <<EOF
[fabric]
nop_interval_secs = 5
nop_timeout_secs = 20
state_dir = "$KL_WORK/state"

[control]
socket = "$CTL"

[metrics]
listen = "$METRICS"

[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]
alua_state = "$1"

[[portal_group]]
tag = 2
listen = ["127.0.0.2:3260"]
alua_state = "${2:-active_non_optimized}"

[[target]]
name = "$IQN"
portal_groups = [1, 2]
explicit_alua = ${3:-false}
[[target.lun]]
id = 0
backstore = "ram"
size = "$((MIB + 64))M"
EOF
}
config_with active_optimized >"$KL_WORK/m.toml"
start_target mpath "$KL_WORK/m.toml" || { fail "start blockwire-target"; finish multipath; exit 1; }
T_PID=$KL_TPID
ctl() { "$KL_BIN/blockwire-target" ctl --control "$CTL" "$@"; }

# udev makes the /dev/mapper node and tells multipathd about new paths, as on a real host.
/lib/systemd/systemd-udevd --daemon >/dev/null 2>&1 || log "systemd-udevd did not start"
cat >/etc/multipath.conf <<'EOF'
defaults {
    user_friendly_names yes
    find_multipaths no
}
devices {
    device {
        vendor "BLOCKWIR"
        product "VIRTUAL-DISK"
        hardware_handler "1 alua"
        path_grouping_policy group_by_prio
        prio alua
        path_checker tur
        failback immediate
        no_path_retry 12
    }
}
EOF

out=$(iadm -m discovery -t sendtargets -p 127.0.0.1:3260)
printf '%s\n' "$out" | sed 's/^/    | /'
grep -q "127.0.0.1:3260,1 $IQN" <<<"$out" && grep -q "127.0.0.2:3260,2 $IQN" <<<"$out" &&
    pass "SendTargets lists both portal groups" || fail "SendTargets: $out"
# login_both [LABEL]: logs in through both portals and sets devs to the two paths' disks.
login_both() {
    local p sid d sids
    for p in 127.0.0.1:3260 127.0.0.2:3260; do
        # Multipath wants a failed path given up quickly so that I/O moves to the other group.
        iscsiadm -m node -T "$IQN" -p "$p" -o update -n node.session.timeo.replacement_timeout -v 5 >/dev/null
        check "${1:+$1: }login through $p" iscsiadm -m node -T "$IQN" -p "$p" --login
    done
    sids=$(for s in /sys/class/iscsi_session/session*; do echo "${s##*session}"; done)
    devs=()
    for sid in $sids; do
        d=$(lun_dev "$sid" 0) && devs+=("$d")
    done
    [ ${#devs[@]} = 2 ] && pass "${1:+$1: }two paths: ${devs[*]}" || fail "${1:+$1: }paths: ${devs[*]}"
}
login_both
# The host's paths in the metrics: its sessions with the target, by InitiatorName.
host_paths() {
    curl -s "http://$METRICS/metrics" | awk -v t="$IQN" -v me="$KL_INITIATOR" \
        '$1 ~ /^blockwire_initiator_sessions[{]/ && $1 ~ "target=\"" t "\"" && $1 ~ "initiator=\"" me "\"" {print $2}'
}
n=$(host_paths)
[ "$n" = 2 ] && pass "metrics: host $KL_INITIATOR has 2 sessions (paths) with $IQN" ||
    fail "metrics: host $KL_INITIATOR has '$n' sessions with $IQN, want 2"
for d in "${devs[@]}"; do
    r=$(sg_rtpg -d "/dev/$d" 2>&1)
    printf '%s\n' "$r" | sed "s/^/    $d | /" | head -12
    grep -q "target port group id : 0x1" <<<"$r" && grep -q "target port group id : 0x2" <<<"$r" &&
        pass "REPORT TARGET PORT GROUPS on $d: groups 1 and 2" || fail "RTPG on $d"
    h=$(cat "/sys/block/$d/device/dh_state" 2>/dev/null)
    [ "$h" = alua ] && pass "$d: scsi_dh_alua attached" || fail "$d: device handler '$h'"
done
dmesg | grep -i "alua" | tail -n 4 | sed 's/^/    kernel: /'

# multipathd starts once both paths are there: it scans them and builds the map.
multipathd -s >"$KL_OUT/multipathd.log" 2>&1 &
MPD=$!
if ! timeout 90 bash -c 'until [ "$(multipath -ll 2>/dev/null | grep -c "active ready")" = 2 ]; do sleep 1; done'; then
    log "the map did not get both paths; multipath -v3:"
    multipath -v3 2>&1 | tail -n 40 | sed 's/^/    /'
fi
before=$(multipath -ll 2>&1)
printf 'multipath -ll (before):\n%s\n' "$before" | sed 's/^/    /'
printf '%s\n' "$before" >"$KL_OUT/multipath-before.txt"
map=$(multipath -ll 2>/dev/null | awk '/BLOCKWIR/{print $1; exit}')
# group_by_prio: one path group per ALUA state (alua prio: 50 active/optimized, 10 non-optimized).
if [ -n "$map" ] && grep -A1 "prio=50 status=" <<<"$before" | grep -q " sd" &&
    grep -A1 "prio=10 status=enabled" <<<"$before" | grep -q " sd"; then
    pass "map $map: two path groups, prio=50 (active/optimized) and prio=10 (active/non-optimized)"
else
    fail "multipath map with two ALUA path groups"
fi
# udev makes the node after the map exists; on a loaded machine that can take a while.
timeout 30 bash -c 'until [ -b "$1" ]; do sleep 0.2; done' _ "/dev/mapper/$map" ||
    fail "/dev/mapper/$map is not a block device after 30 s"

opt_dev=$(awk '/prio=50/{getline; print}' <<<"$before" | grep -o 'sd[a-z]*' | head -1)
other_dev=$(awk '/prio=10/{getline; print}' <<<"$before" | grep -o 'sd[a-z]*' | head -1)
log "optimized path: $opt_dev, non-optimized: $other_dev"

# A planned drain: group 1 put in standby by a reload of the edited file, then back. The
# target tells every session ASYMMETRIC ACCESS STATE CHANGED (2Ah/06h); scsi_dh_alua reads
# the groups again and dm-multipath moves the I/O to group 2 with no failed request, then
# back to group 1 (failback immediate) once it is active/optimized again.
# group_of DEV: "prio=N status=S" of the path group DEV is in.
group_of() { multipath -ll 2>/dev/null | grep -B1 " $1 " | grep -o 'prio=[0-9]* status=[a-z]*' | head -1; }
export -f group_of
fio_verify "/dev/mapper/$map" "${MIB}M" >"$KL_OUT/fio-drain.log" 2>&1 &
drain_pid=$!
wait_written "$opt_dev" 8192 300 || fail "drain: no writes on $opt_dev"
config_with standby >"$KL_WORK/m.toml"
r=$(ctl config.reload 2>&1)
printf '    ctl config.reload (group 1 standby): %s\n' "$(tr -s ' \n' ' ' <<<"$r")"
grep -q "portal group 1 of $IQN: active_optimized -> standby" <<<"$r" &&
    pass "reload: portal group 1 to standby" || fail "reload to standby: $r"
if wait_written "$other_dev" 8192 120; then
    pass "group 1 in standby: writes move to $other_dev (group 2)"
else
    fail "group 1 in standby: no writes on $other_dev"
fi
timeout 60 bash -c 'until [ "$(group_of "$1")" = "prio=1 status=enabled" ]; do sleep 1; done' _ "$opt_dev" 2>/dev/null || true
g_opt=$(group_of "$opt_dev") g_other=$(group_of "$other_dev")
# (Group 2 is now the one reported preferred: the alua prioritizer gives it 10 + 80.)
[ "$g_opt" = "prio=1 status=enabled" ] && [ "${g_other#* }" = "status=active" ] &&
    pass "multipath: $opt_dev in a standby group ($g_opt), $other_dev active ($g_other)" ||
    fail "multipath after standby: $opt_dev '$g_opt', $other_dev '$g_other'"
config_with active_optimized >"$KL_WORK/m.toml"
r=$(ctl config.reload 2>&1)
grep -q "portal group 1 of $IQN: standby -> active_optimized" <<<"$r" &&
    pass "reload: portal group 1 active/optimized again" || fail "reload back: $r"
timeout 60 bash -c 'until [ "$(group_of "$1")" = "prio=50 status=active" ]; do sleep 1; done' _ "$opt_dev" 2>/dev/null || true
g_opt=$(group_of "$opt_dev")
[ "$g_opt" = "prio=50 status=active" ] && pass "multipath: $opt_dev active again ($g_opt)" ||
    fail "multipath after failback: $opt_dev '$g_opt'"
if wait "$drain_pid"; then
    pass "fio verify through /dev/mapper/$map across the drain and failback: $(fio_result "$KL_OUT/fio-drain.log")"
else
    fail "fio across the drain: $(tail -n 5 "$KL_OUT/fio-drain.log" | tr '\n' ' ')"
fi
multipath -ll 2>&1 | sed 's/^/    (after failback) /'
dmesg | grep -iE "alua|multipath" | tail -n 6 | sed 's/^/    kernel: /'

fio_verify "/dev/mapper/$map" "${MIB}M" >"$KL_OUT/fio-mpath.log" 2>&1 &
fio_pid=$!
wait_written "$opt_dev" 32768 300 ||
    fail "no writes on the optimized path $opt_dev"
during=$(multipath -ll 2>&1)
printf 'multipath -ll (fio running):\n%s\n' "$during" | sed 's/^/    /'
grep -A1 "prio=50 status=active" <<<"$during" | grep -q " $opt_dev " &&
    pass "under I/O the active/optimized group ($opt_dev) is the active one" || fail "active group under I/O"
log "portal 127.0.0.1:3260 (group 1) goes away after $(($(sectors_written "$opt_dev") / 2048)) MiB through $opt_dev"
r=$(ctl portal.close '{"listen":"127.0.0.1:3260"}' 2>&1)
rc=$?
printf '    ctl portal.close: %s\n' "$r"
[ $rc = 0 ] && pass "portal.close 127.0.0.1:3260" || fail "portal.close: exit $rc"
if (exec 3<>/dev/tcp/127.0.0.1/3260) 2>/dev/null; then fail "127.0.0.1:3260 still accepts"; else pass "127.0.0.1:3260 refuses connections"; fi
timeout 120 bash -c 'until multipath -ll 2>/dev/null | grep -q "failed"; do sleep 1; done'
n=
for _ in $(seq 50); do n=$(host_paths); [ "$n" = 1 ] && break; sleep 0.2; done
[ "$n" = 1 ] && pass "metrics: the host's sessions went from 2 to 1 with its path through group 1" ||
    fail "metrics: host $KL_INITIATOR has '$n' sessions after group 1 went, want 1"
if wait "$fio_pid"; then
    pass "fio verify through /dev/mapper/$map while group 1 went away: $(fio_result "$KL_OUT/fio-mpath.log")"
else
    fail "fio through the map: $(tail -n 5 "$KL_OUT/fio-mpath.log" | tr '\n' ' ')"
fi
after=$(multipath -ll 2>&1)
printf 'multipath -ll (after):\n%s\n' "$after" | sed 's/^/    /'
printf '%s\n' "$after" >"$KL_OUT/multipath-after.txt"
line_opt=$(grep -E "[0-9]+:[0-9]+:[0-9]+:[0-9]+ $opt_dev " <<<"$after")
line_other=$(grep -E "[0-9]+:[0-9]+:[0-9]+:[0-9]+ $other_dev " <<<"$after")
if grep -qE "failed|faulty" <<<"$line_opt" && grep -q "active ready" <<<"$line_other"; then
    pass "after: $opt_dev failed ($line_opt), $other_dev carries the I/O ($line_other)"
else
    fail "after: $opt_dev '$line_opt', $other_dev '$line_other'"
fi
dmesg | grep -E "device-mapper: multipath|Failing path|detected conn error" | tail -n 6 | sed 's/^/    kernel: /'

iscsiadm -m node --logoutall=all >/dev/null 2>&1
stop_target "$T_PID"

# Explicit ALUA: an active/passive pair that the host fails over with SET TARGET PORT GROUPS.
# multipathd starts again once both paths are there: a map built from the standby path alone
# would activate its group, and scsi_dh_alua would ask the target to make it active right away.
kill "$MPD" 2>/dev/null
wait "$MPD" 2>/dev/null
timeout 30 bash -c 'while multipath -ll 2>/dev/null | grep -q BLOCKWIR; do multipath -F >/dev/null 2>&1; sleep 1; done' ||
    log "the old map is still there"
config_with active_optimized standby true >"$KL_WORK/m.toml"
start_target mpath-explicit "$KL_WORK/m.toml" || { fail "start blockwire-target (explicit ALUA)"; finish multipath; exit 1; }
T_PID=$KL_TPID
login_both "explicit ALUA"
inq=$(sg_inq "/dev/${devs[0]}" 2>&1)
grep -q "TPGS=3" <<<"$inq" && pass "standard INQUIRY: TPGS=3 (implicit and explicit ALUA)" ||
    fail "INQUIRY TPGS: $(grep -o 'TPGS=[0-9]' <<<"$inq")"
multipathd -s >"$KL_OUT/multipathd-explicit.log" 2>&1 &
MPD=$!
timeout 90 bash -c 'until [ "$(multipath -ll 2>/dev/null | grep -c "active ready")" = 2 ]; do sleep 1; done' ||
    log "the explicit-ALUA map did not get both paths"
before=$(multipath -ll 2>&1)
printf 'multipath -ll (explicit ALUA, before):\n%s\n' "$before" | sed 's/^/    /'
map=$(awk '/BLOCKWIR/{print $1; exit}' <<<"$before")
# multipath -ll lists the path groups by priority, highest first: group 1 (active/optimized).
act_dev=$(awk '/prio=[0-9]+ status=/{getline; print; exit}' <<<"$before" | grep -o 'sd[a-z]*' | head -1)
pas_dev=$(awk '/prio=1 /{getline; print}' <<<"$before" | grep -o 'sd[a-z]*' | head -1)
[ -n "$map" ] && [ -n "$act_dev" ] && [ -n "$pas_dev" ] && [ "$act_dev" != "$pas_dev" ] &&
    pass "map $map: active path $act_dev (group 1), standby path $pas_dev (group 2, prio=1)" ||
    fail "explicit-ALUA map: map '$map' active '$act_dev' standby '$pas_dev'"
timeout 30 bash -c 'until [ -b "$1" ]; do sleep 0.2; done' _ "/dev/mapper/$map" ||
    fail "/dev/mapper/$map is not a block device after 30 s"
fio_verify "/dev/mapper/$map" "${MIB}M" >"$KL_OUT/fio-explicit.log" 2>&1 &
fio_pid=$!
wait_written "$act_dev" 16384 300 || fail "explicit ALUA: no writes on $act_dev"
r=$(ctl portal.close '{"listen":"127.0.0.1:3260"}' 2>&1)
[ $? = 0 ] && pass "portal.close 127.0.0.1:3260 (group 1, the active side)" || fail "portal.close: $r"
if wait_written "$pas_dev" 8192 180; then
    pass "writes move to $pas_dev (group 2, which was in standby)"
else
    fail "no writes on $pas_dev after group 1 went away"
fi
if wait "$fio_pid"; then
    pass "fio verify through /dev/mapper/$map across the failover: $(fio_result "$KL_OUT/fio-explicit.log")"
else
    fail "fio across the explicit failover: $(tail -n 5 "$KL_OUT/fio-explicit.log" | tr '\n' ' ')"
fi
grep "SET TARGET PORT GROUPS" "$KL_OUT/mpath-explicit.log" | sed 's/^/    target: /' | tail -n 4
grep -q 'ALUA state changed by SET TARGET PORT GROUPS group=2 from="standby" to="active_optimized"' \
    "$KL_OUT/mpath-explicit.log" &&
    pass "the host's SET TARGET PORT GROUPS moved group 2 from standby to active/optimized" ||
    fail "no SET TARGET PORT GROUPS for group 2 in the target's log"
r=$(ctl lun.list 2>&1)
g2=$(python3 -c 'import json,sys; t=json.load(sys.stdin)["targets"][0]; print(json.dumps([g for g in t["port_groups"] if g["id"]==2][0], sort_keys=True))' <<<"$r")
printf '    lun.list group 2: %s\n' "$g2"
grep -q '"set_by": "initiator"' <<<"$g2" && grep -q '"state": "active_optimized"' <<<"$g2" &&
    pass "lun.list: group 2 active_optimized, set by the initiator" || fail "lun.list group 2: $g2"
shown=$(ctl config.show 2>&1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["toml"])')
grep -A3 '^\[target.alua_state\]' <<<"$shown" | sed 's/^/    config.show | /'
grep -A3 '^\[target.alua_state\]' <<<"$shown" | grep -q '^2 = "active_optimized"' &&
    pass "config.show keeps the state the initiator set ([target.alua_state] 2 = \"active_optimized\")" ||
    fail "config.show: no [target.alua_state] 2 = \"active_optimized\""
dmesg | grep -iE "alua|stpg|multipath" | tail -n 6 | sed 's/^/    kernel: /'
multipath -ll 2>&1 | sed 's/^/    (explicit, after) /'

# rtpg_group DEV ID: the asymmetric access state and STATUS CODE of target port group ID in
# REPORT TARGET PORT GROUPS through DEV, as sg_rtpg prints them ("0x00 0x01").
rtpg_group() {
    sg_rtpg -d "/dev/$1" 2>/dev/null | awk -v id="$(printf '0x%x' "$2")" '
        /target port group id :/ { cur = ($6 == id) }
        cur && /asymmetric access state :/ { state = $8 }
        cur && /status code :/ { status = $4 }
        END { print state, status }'
}
# The daemon restarts from the same file, never saved: the state the host set is back from
# [fabric] state_dir before any session logs in again.
stop_target "$T_PID"
start_target mpath-explicit-restarted "$KL_WORK/m.toml" ||
    { fail "start blockwire-target again (explicit ALUA)"; finish multipath; exit 1; }
T_PID=$KL_TPID
grep "before the restart restored" "$KL_OUT/mpath-explicit-restarted.log" | sed 's/^/    target: /'
grep -q 'before the restart restored group=2 from="standby" to="active_optimized"' \
    "$KL_OUT/mpath-explicit-restarted.log" &&
    pass "after a restart the target puts back group 2 active/optimized, as the host set it" ||
    fail "no restored ALUA state for group 2 in the restarted target's log"
# open-iscsi logs in again on its own; until it has, REPORT TARGET PORT GROUPS fails.
got=""
for _ in $(seq 1 60); do
    got=$(rtpg_group "$pas_dev" 2)
    [ "$got" = "0x00 0x01" ] && break
    sleep 1
done
printf '    sg_rtpg through %s after the restart, group 2: %s\n' "$pas_dev" "$got"
[ "$got" = "0x00 0x01" ] &&
    pass "REPORT TARGET PORT GROUPS after the restart: group 2 active/optimized (0x00), set by SET TARGET PORT GROUPS (status 0x01)" ||
    fail "REPORT TARGET PORT GROUPS after the restart, group 2: '$got' (want '0x00 0x01')"
if timeout 120 dd if="/dev/mapper/$map" of=/dev/null bs=1M count=16 iflag=direct status=none; then
    pass "the map reads after the restart"
else
    fail "reading /dev/mapper/$map after the restart"
fi

iscsiadm -m node --logoutall=all >/dev/null 2>&1
kill "$MPD" 2>/dev/null
stop_target "$T_PID"
dmesg >"$KL_OUT/dmesg-multipath.log"
finish multipath
