#!/bin/bash
# interop/test-integrity.sh — data integrity through libiscsi against blockwire-target.
#
# A 256 MiB random pattern (from /dev/urandom, in /dev/shm) is written to LUN 0 of a
# blockwire RAM LUN with WRITE(16) of 1 MiB, 8 in flight (interop/libiscsi_rw.py
# --write-from: immediate data, unsolicited Data-Out and R2T-solicited Data-Out as the
# negotiation allows), then read back in a NEW session with READ(16) of 1 MiB
# (--read-to: many Data-In PDUs per command) and the two sha256 sums compared.
#
# Three times, each against its own daemon: with digests off, with HeaderDigest=CRC32C
# negotiated (both sessions; that daemon requires it) at another LBA with a fresh pattern,
# and against a file LUN in tmpfs, whose READ payloads leave by copying sends from the
# file's mapping, several Data-In PDUs a send. libiscsi offers HeaderDigest (iscsi_set_header_digest
# / the URL), but it never offers DataDigest: libiscsi has no data-digest support at all, so
# no libiscsi-based tool can test data digests. Those are covered elsewhere: 256 MiB with
# HeaderDigest and DataDigest CRC32C in target/tests/fabric.rs, and open-iscsi's kernel
# initiator with both digests on in the kernel lab (interop/kernel/guest-initiator.sh).
#
# Needs libiscsi-bin (libiscsi.so.7), python3. Exit 1 on any mismatch or error.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"

IQN=iqn.2026-11.io.blockwire:integrity
MIB=256
tmp=$(mktemp -d /dev/shm/bw-integrity.XXXXXX)
pid=""
cleanup() {
    if [ -n "$pid" ]; then stop_blockwire "$pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# Any initiator, 1 GiB RAM LUN. The header-digest round runs against a daemon whose
# [fabric] header_digest = "require" (CRC32C only), so a login that did not negotiate the
# digest would fail: this proves the digest is really on.
blockwire_config_file "$tmp/plain.toml" "$IQN" 1G
{ printf '[fabric]\nheader_digest = "require"\n\n'; cat "$tmp/plain.toml"; } >"$tmp/hdigest.toml"

# A file LUN in tmpfs: READ payloads to this host's initiator leave by copying sends from
# the file's mapping, the Data-In PDUs of one READ queued together in one send. The round
# also asks the daemon's metrics that the read-back went that way.
metrics_port=$(free_port)
{
    printf '[[portal_group]]\ntag = 1\nlisten = ["127.0.0.1:3260"]\n\n'
    printf '[[target]]\nname = "%s"\n\n' "$IQN"
    printf '[[target.lun]]\nid = 0\nbackstore = "file"\npath = "%s"\nsize = "1G"\n\n' "$tmp/lun0.img"
    printf '[metrics]\nlisten = "127.0.0.1:%s"\n' "$metrics_port"
} >"$tmp/file.toml"
# after_read_CONFIG — run, if defined, after the read-back, before the daemon stops.
after_read_file() {
    local sent
    sent=$(blockwire_metric_sum "$metrics_port" blockwire_read_path_copy_bytes_total \
        'path="sendfile",kind="sent_from_user"')
    echo "    file LUN: $sent payload bytes left by copying sends from the file's mapping"
    [ "$sent" -ge $((MIB << 20)) ] || {
        echo "    expected the read-back ($((MIB << 20)) bytes) by copying sends from the mapping"
        return 1
    }
}

fails=0
# round NAME CONFIG LBA [libiscsi_rw.py options...] — own daemon per round
round() {
    local name=$1 config=$2 lba=$3 rc=0 a b
    shift 3
    port=$(free_port)
    pid=$(start_blockwire "$port" "$tmp" "$tmp/$config.toml")
    head -c "${MIB}M" /dev/urandom >"$tmp/pattern"
    local -a rw=(python3 "$here/libiscsi_rw.py" "127.0.0.1:$port" "$IQN" 0 --lba "$lba"
        --xfer 1048576 --qd 8 --initiator "iqn.2026-11.io.blockwire:integrity-$name" "$@")
    timeout 120 "${rw[@]}" --write-from "$tmp/pattern" || rc=$?
    [ $rc = 0 ] && { timeout 120 "${rw[@]}" --read-to "$tmp/readback" --length $((MIB << 20)) || rc=$?; }
    if [ $rc = 0 ] && declare -F "after_read_$config" >/dev/null; then "after_read_$config" || rc=$?; fi
    stop_blockwire "$pid" 2>/dev/null || true
    pid=""
    if [ $rc != 0 ]; then
        echo "FAIL $name: libiscsi_rw.py exit $rc"
        tail -n 15 "$tmp/blockwire-$port.log" | sed 's/^/    daemon: /'
        fails=$((fails + 1))
        return
    fi
    a=$(sha256sum <"$tmp/pattern" | cut -d' ' -f1)
    b=$(sha256sum <"$tmp/readback" | cut -d' ' -f1)
    if [ "$a" = "$b" ]; then
        echo "PASS $name: $MIB MiB at LBA $lba, sha256 $a"
    else
        echo "FAIL $name: wrote sha256 $a, read back $b"
        # Where does it differ? (first differing byte, 1-based)
        cmp "$tmp/pattern" "$tmp/readback" | head -n 1 | sed 's/^/    /' || true
        fails=$((fails + 1))
    fi
    rm -f "$tmp/pattern" "$tmp/readback"
}

round digests-off plain 0
round header-digest-crc32c hdigest $((512 * 2048)) --header-digest
round file-lun-mapped-sends file $((256 * 2048))

echo "== $([ $fails = 0 ] && echo "all passed" || echo "$fails FAILED")"
[ $fails = 0 ]
