#!/usr/bin/env bash
# interop/kernel/guest-mgmt.sh — runs INSIDE the kernel lab guest (see interop/test-kernel-lab.sh).
#
# The management plane under a real kernel initiator: open-iscsi is logged in to blockwire-target
# and runs fio crc32c verify on LUN 0 while, through the control socket and SIGHUP,
#   - a LUN is added (the kernel sees it after `iscsiadm -m session --rescan`),
#   - the access list gains another initiator (this one stays in it),
#   - LUN 0 gets a QoS ceiling of 50 IOPS for 3 s (the kernel's commands wait their turn), lifted,
#     then each initiator a ceiling of 50 IOPS of its own for 3 s, lifted,
#   - an unused LUN is removed (after the kernel let go of it), a busy one is refused,
#   - `ctl config.save` writes the running configuration over the file it came from, which
#     `--check` accepts and which holds every change,
#   - SIGHUP reloads an edited file (a LUN more, seen after a rescan) and a broken one changes
#     nothing;
# fio ends without an error, the kernel's session is the one it logged in with (one login in the
# target's log), and the Prometheus endpoint shows fio's traffic in LUN 0's latency histograms
# and in the kernel host's own (per initiator) counters.
# Env: KL_OUT (results dir shared with the host), KL_FIO_MIB (fio size, default 256).
. "$(dirname "$0")/lib.sh"

MIB=${KL_FIO_MIB:-256}
ME=iqn.2026-11.lab:kernel-guest
PFX=iqn.2026-11.io.blockwire
T=$PFX:lab-mgmt
export KL_INITIATOR=$ME
SOCK=$KL_WORK/control.sock
METRICS=127.0.0.1:9450

lab_up || { fail "lab-up: modules or iscsid"; finish mgmt; exit 1; }
truncate -s $((MIB + 256))M "$KL_WORK/fs.img"
mkfs.ext4 -q -F "$KL_WORK/fs.img"
mkdir -p "$KL_WORK/fs"
mount -o loop "$KL_WORK/fs.img" "$KL_WORK/fs" || { fail "backing-fs"; finish mgmt; exit 1; }

CONF=$KL_WORK/etc/target.toml
mkdir -p "$KL_WORK/etc"
cat >"$CONF" <<EOF
[fabric]
nop_interval_secs = 5
nop_timeout_secs = 20

[control]
socket = "$SOCK"

[metrics]
listen = "$METRICS"

[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]

[[target]]
name = "$T"
allow = ["$ME"]
[[target.lun]]
id = 0
backstore = "file"
path = "$KL_WORK/fs/lun0.img"
size = "$((MIB + 64))M"
[[target.lun]]
id = 1
backstore = "ram"
size = "64M"
EOF
start_target target "$CONF" || { fail "start blockwire-target"; finish mgmt; exit 1; }
T_PID=$KL_TPID

# ctl METHOD [PARAMS]: one control call; its JSON result in $KL_OUT/ctl.log and on stdout.
ctl() {
    printf '\n$ ctl %s %s\n' "$1" "${2:-}" >>"$KL_OUT/ctl.log"
    "$KL_BIN/blockwire-target" ctl --control "$SOCK" "$@" 2>&1 | tee -a "$KL_OUT/ctl.log"
    return "${PIPESTATUS[0]}"
}

iadm -m discovery -t st -p 127.0.0.1:3260 >/dev/null || fail "discovery"
iadm -m node -T "$T" -p 127.0.0.1:3260 --login >/dev/null || { fail "login"; finish mgmt; exit 1; }
sid=$(session_id "$T")
dev0=$(lun_dev "$sid" 0) && dev1=$(lun_dev "$sid" 1) || { fail "LUNs 0 and 1 as disks"; finish mgmt; exit 1; }
pass "logged in: session $sid, LUN 0 /dev/$dev0, LUN 1 /dev/$dev1"

fio_verify "/dev/$dev0" "${MIB}M" >"$KL_OUT/fio-mgmt.log" 2>&1 &
FIO=$!
# Changes start once fio is writing.
wait_written "$dev0" 4096 60 || fail "fio never wrote to /dev/$dev0"

# QoS: a ceiling on the LUN fio writes to, set while fio runs and lifted 3 s later; the kernel's
# commands wait their turn (counted by the target), none fails (fio verifies at the end) and the
# session stays (checked at the end).
if out=$(ctl lun.limit "{\"target\": \"$T\", \"lun\": 0, \"iops\": 50}") && grep -q "no limit -> 50 IOPS" <<<"$out"; then
    sleep 3
    q=$(ctl lun.list | python3 -c 'import json,sys; v=json.load(sys.stdin)
l=[l for t in v["targets"] for l in t["luns"] if l["lun"]==0][0]; q=l["qos"]
print(q["iops_limit"], q["delayed_commands"], q["waiting"], l["counters"]["writes"]["commands"])')
    read -r limit delayed waiting writes <<<"$q"
    if ctl lun.limit "{\"target\": \"$T\", \"lun\": 0, \"iops\": 0}" | grep -q "50 IOPS -> no limit" &&
        [ "$limit" = 50 ] && [ "${delayed:-0}" -gt 0 ]; then
        pass "lun.limit: 50 IOPS on LUN 0 under fio, 3 s: $delayed commands delayed, $waiting waiting then ($writes WRITEs so far); lifted"
    else
        fail "lun.limit under fio: limit=$limit delayed=$delayed waiting=$waiting"
    fi
else
    fail "lun.limit: $out"
fi

# Each host's own ceiling on the same LUN (initiator_iops_limit): the kernel's commands wait at
# its ceiling as at the LUN's, counted once each, and the ceiling lifts the same way.
if out=$(ctl lun.limit "{\"target\": \"$T\", \"lun\": 0, \"initiator_iops\": 50}") &&
    grep -q "no limit -> each initiator 50 IOPS" <<<"$out"; then
    sleep 3
    q=$(ctl lun.list | python3 -c 'import json,sys; v=json.load(sys.stdin)
l=[l for t in v["targets"] for l in t["luns"] if l["lun"]==0][0]; q=l["qos"]
print(q["initiator_iops_limit"], q["delayed_commands"], q["waiting"])')
    read -r each delayed_each waiting_each <<<"$q"
    if ctl lun.limit "{\"target\": \"$T\", \"lun\": 0, \"initiator_iops\": 0}" | grep -q "each initiator 50 IOPS -> no limit" &&
        [ "$each" = 50 ] && [ "${delayed_each:-0}" -gt "${delayed:-0}" ]; then
        pass "lun.limit: each initiator 50 IOPS on LUN 0 under fio, 3 s: delayed commands $delayed -> $delayed_each, $waiting_each waiting then; lifted"
    else
        fail "initiator_iops under fio: limit=$each delayed=$delayed -> $delayed_each waiting=$waiting_each"
    fi
else
    fail "lun.limit initiator_iops: $out"
fi

# A LUN added live; the kernel finds it on a rescan.
if ctl lun.add "{\"target\": \"$T\", \"lun\": {\"id\": 2, \"backstore\": \"ram\", \"size\": \"32M\"}}" >/dev/null; then
    iadm -m session -r "$sid" --rescan >/dev/null
    if dev2=$(lun_dev "$sid" 2); then
        pass "lun.add: LUN 2 appeared as /dev/$dev2 after iscsiadm --rescan ($(cat /sys/block/$dev2/size) sectors)"
    else
        fail "lun.add: no disk for LUN 2 after the rescan"
    fi
else
    fail "lun.add"
fi

# The access list: another initiator joins; this session keeps running.
ctl acl.add "{\"target\": \"$T\", \"initiator\": \"iqn.2026-11.lab:another-node\"}" >/dev/null &&
    pass "acl.add: iqn.2026-11.lab:another-node admitted" || fail "acl.add"

# A busy LUN is refused; the unused one goes once the kernel let go of it.
if out=$(ctl lun.remove "{\"target\": \"$T\", \"lun\": 0}"); then
    fail "lun.remove of the LUN fio writes to was accepted"
else
    grep -q "in use\|running on it\|served a READ or WRITE" <<<"$out" &&
        pass "lun.remove of busy LUN 0 refused: $(head -n 1 <<<"$out")" || fail "lun.remove refusal: $out"
fi
echo 1 >"/sys/block/$dev1/device/delete"
idle=""
for _ in $(seq 1 60); do
    ago=$(ctl lun.list | python3 -c 'import json,sys; v=json.load(sys.stdin)
l=[l for t in v["targets"] for l in t["luns"] if l["lun"]==1][0]
print("idle" if l["last_io_secs_ago"] is None or l["last_io_secs_ago"] > 10 else "busy")')
    [ "$ago" = idle ] && { idle=1; break; }
    sleep 1
done
[ -n "$idle" ] || fail "LUN 1 never went idle"
if ctl lun.remove "{\"target\": \"$T\", \"lun\": 1}" >/dev/null; then
    iadm -m session -r "$sid" --rescan >/dev/null
    pass "lun.remove: unused LUN 1 removed"
else
    fail "lun.remove of unused LUN 1"
fi

# config.save over the file it came from: a backup of the old one, --check accepts it, and it
# holds every change so far.
if ctl config.save >/dev/null; then
    ls "$KL_WORK/etc/backup/"target.toml.* >/dev/null 2>&1 && pass "config.save: old file kept in backup/" ||
        fail "config.save left no backup"
    "$KL_BIN/blockwire-target" --check --config "$CONF" >"$KL_OUT/check.log" 2>&1 &&
        pass "the saved file passes --check" || fail "--check of the saved file: $(tail -n 3 "$KL_OUT/check.log")"
    grep -q 'iqn.2026-11.lab:another-node' "$CONF" && grep -q 'size = "32M"' "$CONF" &&
        ! grep -q 'size = "64M"' "$CONF" && pass "the saved file holds the ACL entry and LUN 2, not LUN 1" ||
        fail "saved file content: $(cat "$CONF")"
    cp "$CONF" "$KL_OUT/saved-target.toml"
else
    fail "config.save"
fi

# SIGHUP: an edited file is applied (LUN 3), a broken one changes nothing.
cat >>"$CONF" <<EOF

[[target.lun]]
id = 3
backstore = "ram"
size = "16M"
EOF
kill -HUP "$T_PID"
if timeout 30 bash -c 'until grep -q "LUN 3 of" "$1"; do sleep 0.2; done' _ "$KL_OUT/target.log"; then
    iadm -m session -r "$sid" --rescan >/dev/null
    dev3=$(lun_dev "$sid" 3) && pass "SIGHUP reload: LUN 3 appeared as /dev/$dev3" || fail "no disk for LUN 3"
else
    fail "SIGHUP reload did not add LUN 3"
fi
good=$(cat "$CONF")
printf '%s\n[[target.lun]]\nid = 4\nbackstore = "tape"\n' "$good" >"$CONF"
kill -HUP "$T_PID"
if timeout 30 bash -c 'until grep -q "reload failed" "$1"; do sleep 0.2; done' _ "$KL_OUT/target.log"; then
    kill -0 "$T_PID" && pass "SIGHUP with a broken file: $(grep 'reload failed' "$KL_OUT/target.log" | tail -n 1 | sed 's/.*ERROR //')" ||
        fail "the daemon died on a broken reload"
else
    fail "a broken file was not refused"
fi
printf '%s\n' "$good" >"$CONF"

wait "$FIO"
rc=$?
[ "$rc" = 0 ] && pass "fio verify on /dev/$dev0 through every change: $(fio_result "$KL_OUT/fio-mgmt.log")" ||
    fail "fio exit $rc: $(grep -i 'err\|verify' "$KL_OUT/fio-mgmt.log" | head -n 3 | tr '\n' ' ')"
logins=$(grep -c "login complete target=$T initiator=$ME" "$KL_OUT/target.log")
[ "$(session_id "$T")" = "$sid" ] && [ "$logins" = 1 ] &&
    pass "the kernel's session $sid never dropped (1 login in the target's log)" ||
    fail "session changed: now $(session_id "$T"), $logins logins"

# Prometheus: fio's traffic in LUN 0's latency histograms.
curl -s "http://$METRICS/metrics" >"$KL_OUT/metrics.txt"
writes=$(awk -v t="$T" '$1 ~ /^blockwire_lun_command_duration_seconds_count/ && $1 ~ "target=\"" t "\"" && $1 ~ /lun="0"/ && $1 ~ /op="write"/ {print $2}' "$KL_OUT/metrics.txt")
bytes=$(awk -v t="$T" '$1 ~ /^blockwire_lun_bytes_total/ && $1 ~ "target=\"" t "\"" && $1 ~ /lun="0"/ && $1 ~ /op="write"/ {print $2}' "$KL_OUT/metrics.txt")
if [ -n "$writes" ] && [ "${writes%.*}" -gt 0 ] && [ -n "$bytes" ] && [ "${bytes%.*}" -ge $((MIB << 20)) ]; then
    pass "metrics: LUN 0 write latency histogram counts $writes commands, $bytes bytes written"
else
    fail "metrics: LUN 0 writes=$writes bytes=$bytes: $(grep 'lun="0"' "$KL_OUT/metrics.txt" | head -n 5 | tr '\n' ' ')"
fi
# The kernel's host, per initiator: fio wrote to LUN 0 only, so the host's WRITEs are LUN 0's,
# and its READs at least LUN 0's (the kernel also read the other LUNs' partition tables).
host_sample() { # FAMILY OP
    awk -v f="$1" -v t="$T" -v me="$ME" -v op="$2" '$1 ~ "^" f "[{]" && $1 ~ "target=\"" t "\"" &&
        $1 ~ "initiator=\"" me "\"" && $1 ~ "op=\"" op "\"" {print $2}' "$KL_OUT/metrics.txt"
}
lun0_sample() { # FAMILY OP
    awk -v f="$1" -v t="$T" -v op="$2" '$1 ~ "^" f "[{]" && $1 ~ "target=\"" t "\"" && $1 ~ /lun="0"/ &&
        $1 ~ "op=\"" op "\"" {print $2}' "$KL_OUT/metrics.txt"
}
h_writes=$(host_sample blockwire_initiator_commands_total write)
h_wbytes=$(host_sample blockwire_initiator_bytes_total write)
h_reads=$(host_sample blockwire_initiator_commands_total read)
h_hist=$(host_sample blockwire_initiator_command_duration_seconds_count write)
l_reads=$(lun0_sample blockwire_lun_commands_total read)
if [ -n "$h_writes" ] && [ "$h_writes" = "$writes" ] && [ "$h_wbytes" = "$bytes" ] && [ "$h_hist" = "$writes" ] &&
    [ -n "$h_reads" ] && [ -n "$l_reads" ] && [ "${h_reads%.*}" -ge "${l_reads%.*}" ]; then
    pass "metrics: host $ME on $T: $h_writes WRITEs ($h_wbytes bytes, as LUN 0's), $h_reads READs (LUN 0: $l_reads)"
else
    fail "metrics: host $ME: writes=$h_writes bytes=$h_wbytes histogram=$h_hist reads=$h_reads against LUN 0's writes=$writes bytes=$bytes reads=$l_reads: $(grep '^blockwire_initiator_commands' "$KL_OUT/metrics.txt" | tr '\n' ' ')"
fi

iadm -m node -T "$T" -p 127.0.0.1:3260 --logout >/dev/null || fail "logout"
stop_target "$T_PID"
finish mgmt
