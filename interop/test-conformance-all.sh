#!/bin/bash
# libiscsi's whole ALL family in CI (iscsi-test-cu -d -S, suite by suite, both test
# initiator names allowed by the ACL) against blockwire-target, with 0 failures:
#   LUN 0  1 GiB RAM, a fixed disk            -> every suite but those below
#   LUN 1  64 MiB RAM, removable = true,      -> PreventAllow, StartStopUnit, NoMedia (eject
#          sanitize_min_seconds = 10             and load) and Sanitize (-S: --allow-sanitize;
#                                                Sanitize.Reset needs an operation still
#                                                running after its resets and re-login)
# LUN0_KIND picks LUN 0's backstore (CI: ram; interop/conformance-lun-kinds.sh runs the others):
#   ram     1 GiB RAM, 512-byte blocks
#   file    1 GiB file in /dev/shm, page cache (mode = "cached")
#   direct  1 GiB file on the root file system (/var/tmp), O_DIRECT (mode = "direct"; tmpfs
#           would not be a real O_DIRECT path)
#   4k      1 GiB RAM with 4096-byte logical blocks
#   blockdev  a 1 GiB loop device (over a sparse file in /var/tmp), O_DIRECT: a block device
#           LUN, as an LVM volume or a disk partition is served (needs root)
#   pi      1 GiB file in /dev/shm formatted with T10 protection information, Type 1
#           (protection = "type1": every block's tuple generated on write, checked on read)
# MultipathIO gets LUN 0's URL twice (two I_T nexuses to one LUN).
# Skips are counted and listed (interop/results/conformance.md explains each). The
# comparison with tgtd and the reruns on specially configured LUNs live in conformance.sh /
# conformance-variants.sh (not CI).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"
. "$here/lib/testcu.sh"

IQN=iqn.2026-11.io.blockwire:conformance-ci
LUN0_KIND=${LUN0_KIND:-ram}
tmp=$(mktemp -d /dev/shm/bw-all.XXXXXX)
disk=""
loopdev=""
pid=""
cleanup() {
    if [ -n "$pid" ]; then stop_blockwire "$pid" 2>/dev/null || true; fi
    if [ -n "$loopdev" ]; then losetup -d "$loopdev" 2>/dev/null || true; fi
    rm -rf "$tmp"
    if [ -n "$disk" ]; then rm -rf "$disk"; fi
}
trap cleanup EXIT

port=$(free_port)
blockwire_config_file "$tmp/target.toml" "$IQN" 1024M \
    "$LIBISCSI_TEST_INITIATOR" "$LIBISCSI_TEST_INITIATOR2"
# LUN 0 is the last table blockwire_config_file wrote: replace its backstore line.
case $LUN0_KIND in
ram) ;;
file) sed -i "s|^backstore = \"ram\"\$|backstore = \"file\"\npath = \"$tmp/lun0.img\"\nmode = \"cached\"|" "$tmp/target.toml" ;;
direct)
    disk=$(mktemp -d /var/tmp/bw-all-direct.XXXXXX)
    sed -i "s|^backstore = \"ram\"\$|backstore = \"file\"\npath = \"$disk/lun0.img\"\nmode = \"direct\"|" "$tmp/target.toml"
    ;;
4k) sed -i 's|^backstore = "ram"$|backstore = "ram"\nblock_size = 4096|' "$tmp/target.toml" ;;
blockdev)
    disk=$(mktemp -d /var/tmp/bw-all-blockdev.XXXXXX)
    truncate -s 1G "$disk/device.img"
    loopdev=$(losetup -f --show "$disk/device.img")
    sed -i "s|^backstore = \"ram\"\$|backstore = \"file\"\npath = \"$loopdev\"\nmode = \"direct\"|" "$tmp/target.toml"
    ;;
pi) sed -i "s|^backstore = \"ram\"\$|backstore = \"file\"\npath = \"$tmp/lun0.img\"\nprotection = \"type1\"|" "$tmp/target.toml" ;;
*)
    echo "LUN0_KIND=$LUN0_KIND: ram, file, direct, 4k, blockdev or pi" >&2
    exit 2
    ;;
esac
cat >>"$tmp/target.toml" <<'TOML'

[[target.lun]]
id = 1
backstore = "ram"
size = "64M"
removable = true
sanitize_min_seconds = 10

[fabric]
# Sanitize.Reset polls TEST UNIT READY every 60 s without reading its socket in between, so it
# cannot answer NOP-Ins for that long: past the default 15 + 30 s the connection would be
# dropped and every re-login would meet a fresh unit attention instead of the end of the
# sanitize. 15 + 90 s outlasts its sleep.
nop_timeout_secs = 90
TOML
pid=$(start_blockwire "$port" "$tmp" "$tmp/target.toml")
url="iscsi://127.0.0.1:$port/$IQN"
echo "== iscsi-test-cu -S ALL against $url/0, LUN 0 $LUN0_KIND (removable medium and SANITIZE suites: $url/1)"
for s in $(testcu_suites ALL); do
    lun=0 secs=${SUITE_TIMEOUT:-180} extra=()
    case $s in
    PreventAllow | StartStopUnit | NoMedia) lun=1 ;;
    # Overwrite waits for three 10 s operations, BlockErase for one, Reset polls every 60 s.
    Sanitize) lun=1 secs=$((secs + 240)) ;;
    MultipathIO) extra=("$url/0") ;;
    esac
    testcu_run "$url/$lun" "ALL.$s" "$tmp/res" "$secs" -S "${extra[@]}" >/dev/null
    if ! kill -0 "$pid" 2>/dev/null; then
        echo "FAIL blockwire-target died during ALL.$s"
        tail -n 30 "$tmp/blockwire-$port.log"
        exit 1
    fi
done
cat "$tmp/res"/*.res >"$tmp/all.res"
total=$(wc -l <"$tmp/all.res")
passed=$(awk '$2 == "PASSED"' "$tmp/all.res" | wc -l)
skipped=$(awk '$2 == "SKIPPED"' "$tmp/all.res" | wc -l)
bad=$(awk '$2 != "PASSED" && $2 != "SKIPPED"' "$tmp/all.res")
echo "ALL family (LUN 0 $LUN0_KIND): $total tests, $passed passed, $skipped skipped, $(printf '%s' "$bad" | grep -c . || true) not passed"
awk '$2 == "SKIPPED" { print "  skipped: " $1 }' "$tmp/all.res"
if [ -n "$bad" ]; then
    echo "FAIL:"
    printf '%s\n' "$bad" | sed 's/^/  /'
    exit 1
fi
echo "== all passed"
