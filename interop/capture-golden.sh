#!/bin/bash
# interop/capture-golden.sh — regenerate the golden PDU fixtures in
# pdu/tests/fixtures/tgtd-libiscsi/ from real traffic between tgtd (target) and libiscsi
# (initiator), with tshark's decoding as an independent oracle.
#
#   usage: sudo interop/capture-golden.sh [OUTDIR]     (root: dumpcap on lo, tgtd)
#   GOLDEN_KEEP_PCAP=/tmp/x.pcapng keeps the capture (plus .runs.tsv/.port) for debugging.
#
# 1. start tgtd on a free loopback port (control port = iSCSI port), one target
#    iqn.2026-11.io.blockwire:golden with a 64 MiB file LUN 1 in /dev/shm, ACL ALL (and,
#    for the header-digest sessions, a second target ...:golden-hdigest, HeaderDigest=CRC32C);
# 2. capture `tcp port PORT` on lo with dumpcap while libiscsi tools run one after another
#    (each opens its own TCP connection(s)); transfers are kept to a few blocks;
# 3. interop/pcap2fixtures.py splits the capture per TCP connection into the raw byte
#    stream of each direction (.i2t.bin / .t2i.bin) and tshark's per-PDU fields (.tshark.tsv),
#    cross-checking PDU boundaries; the script then writes OUTDIR/README.md.
# The pcapng lives in a temp dir and is deleted; everything started is stopped by PID.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
. "$here/lib/peers.sh"

out=${1:-$repo/pdu/tests/fixtures/tgtd-libiscsi}
IQN=iqn.2026-11.io.blockwire:golden
IQN_HD=iqn.2026-11.io.blockwire:golden-hdigest

tmp=$(mktemp -d /dev/shm/bw-golden.XXXXXX)
port="" tgtd_pid="" dump_pid=""
cleanup() {
    stop_pid "$dump_pid"
    stop_tgtd "$port" "$tgtd_pid"
    rm -rf "$tmp"
}
trap cleanup EXIT

# --- 1. the target -----------------------------------------------------------------------
port=$(free_port)
tgtd_pid=$(start_tgtd "$port" "$tmp")
tgtd_new_target "$port" 1 "$IQN"
tgtd_add_lun "$port" 1 1 "$tmp/lun1.img" 64
URL="iscsi://127.0.0.1:$port/$IQN/1"
URL_HD="iscsi://127.0.0.1:$port/$IQN_HD/1"
echo "tgtd pid $tgtd_pid on 127.0.0.1:$port" >&2

# --- 2. capture while the tools run --------------------------------------------------------
pcap=$tmp/golden.pcapng
dumpcap -i lo -B 256 -f "tcp port $port" -w "$pcap" >"$tmp/dumpcap.log" 2>&1 &
dump_pid=$!
# dumpcap prints "Capturing on 'Loopback: lo'" a little before packets really flow, so probe:
# open and close empty TCP connections to tgtd until dumpcap reports captured packets
# ("Packets: N" on its stderr). pcap2fixtures.py skips these payload-less connections.
timeout 10 bash -c 'until grep -q "Capturing on" "$1"; do sleep 0.1; done' _ "$tmp/dumpcap.log"
timeout 20 bash -c '
    until grep -q "Packets" "$1"; do
        (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null || true
        sleep 0.2
    done' _ "$tmp/dumpcap.log" "$port"
sleep 0.3

: >"$tmp/runs.tsv"
# run LABEL CMD... — record the start time (connections are mapped to labels by SYN time),
# run the tool with a bounded time, keep its output for failure reports.
run() {
    local label=$1
    shift
    printf '%s\t%s\n' "$label" "$(date +%s.%N)" >>"$tmp/runs.tsv"
    if ! timeout 60 "$@" >"$tmp/$label.log" 2>&1; then
        echo "capture-golden: '$*' failed:" >&2
        cat "$tmp/$label.log" >&2
        exit 1
    fi
    sleep 0.3 # keep the connections of consecutive runs apart in time
}
RW=(python3 "$here/libiscsi_rw.py" "127.0.0.1:$port" "$IQN" 1)

run ls iscsi-ls -s "iscsi://127.0.0.1:$port"             # discovery, then login + REPORT LUNS...
run inq iscsi-inq "$URL"                                 # standard INQUIRY
run inq-vpd00 iscsi-inq -e 1 -c 0 "$URL"                 # INQUIRY VPD 0x00 (supported pages)
run readcapacity16 iscsi-readcapacity16 "$URL"           # READ CAPACITY(16)
run swp iscsi-swp "$URL"                                 # MODE SENSE (software write protect)
run rw "${RW[@]}" --nop --blocks 64 --lba 0             # NOP, WRITE+READ(10) 32 KiB: R2T, Data-Out, Data-In
run cu-write10-residuals iscsi-test-cu -d -t ALL.iSCSIResiduals.Write10Residuals "$URL"   # over/underflow residuals
run cu-read10-residuals iscsi-test-cu -d -t ALL.iSCSIResiduals.Read10Residuals "$URL"
run rw-beyond-eol "${RW[@]}" --blocks 2 --lba 131071 --expect-check-condition # CHECK CONDITION, sense
run cu-tmf-abort iscsi-test-cu -d -t ALL.iSCSITMF.AbortTaskSimpleAsync "$URL"    # Task Management ABORT TASK
# Header digests: tgtd answers HeaderDigest=None unless the target is configured with
# CRC32C, and then it would also pick CRC32C for libiscsi's default offer "None,CRC32C"; so
# the digest sessions get their own target (tid 2), created only now so iscsi-ls above saw
# one target. libiscsi has no data digests (it always offers DataDigest=None).
tgtd_new_target "$port" 2 "$IQN_HD"
tgtd_add_lun "$port" 2 1 "$tmp/lun2.img" 64
tgtadm -C "$port" --lld iscsi --op update --mode target --tid 2 -n HeaderDigest -v CRC32C
run hdigest-inq iscsi-inq "$URL_HD?header_digest=crc32c" # HeaderDigest=CRC32C session
run hdigest-rw python3 "$here/libiscsi_rw.py" "127.0.0.1:$port" "$IQN_HD" 1 --nop \
    --blocks 24 --lba 4096 --header-digest               # digests on Data-Out/Data-In/R2T too

sleep 0.5
stop_pid "$dump_pid"
dump_pid=""

# GOLDEN_KEEP_PCAP=PATH keeps a copy of the capture for debugging (keep it out of the repo).
if [ -n "${GOLDEN_KEEP_PCAP:-}" ]; then
    cp "$pcap" "$GOLDEN_KEEP_PCAP"
    cp "$tmp/runs.tsv" "$GOLDEN_KEEP_PCAP.runs.tsv"
    echo "port $port" >"$GOLDEN_KEEP_PCAP.port"
fi

# --- 3. split into fixtures ----------------------------------------------------------------
mkdir -p "$out"
rm -f "$out"/*.bin "$out"/*.tshark.tsv
python3 "$here/pcap2fixtures.py" --pcap "$pcap" --port "$port" --runs "$tmp/runs.tsv" \
    --outdir "$out" >"$tmp/summary.tsv"
cat "$tmp/summary.tsv" >&2

# --- README.md with versions, date and the file list -------------------------------------
ver() { dpkg-query -W -f '${Version}' "$1"; }
{
    cat <<EOF
# Golden iSCSI traffic: tgtd (target) ↔ libiscsi (initiator)

Generated by \`interop/capture-golden.sh\` — do not edit; regenerate with

    sudo interop/capture-golden.sh        # from the repository root; needs root for dumpcap

Captured $(date -u +%Y-%m-%d) on $(. /etc/os-release && echo "$PRETTY_NAME") with
tgt $(ver tgt) (tgtd $(tgtd --version 2>/dev/null | head -1)), libiscsi $(ver libiscsi7)
(libiscsi-bin $(ver libiscsi-bin)), tshark $(ver tshark), Python $(python3 -c 'import platform; print(platform.python_version())').

Target: one tgtd on a random loopback port (not 3260), target \`$IQN\`,
LUN 1 = a 64 MiB file (rdwr backing store, 512-byte blocks), LUN 0 = tgt's controller LUN, ACL ALL, no CHAP,
tgtd's default parameters: it answers InitialR2T=Yes, ImmediateData=Yes,
FirstBurstLength=65536, MaxBurstLength=262144 and does not declare MaxRecvDataSegmentLength,
so libiscsi sends at most 8192 bytes per PDU (the RFC 7143 default: immediate data 8192, then
R2T + Data-Out), while tgtd's Data-In PDUs go up to libiscsi's declared 262144.
The hdigest-* sessions go to a second target \`$IQN_HD\` (same
layout, \`HeaderDigest=CRC32C\` set with tgtadm), created after the iscsi-ls run.
The port number and ISIDs/TSIHs differ between regenerations; compare structure, not ports.

## Files, per TCP connection \`NN-LABEL\` (NN = order of the connection in the capture; its
tcp.stream number is the TSV's first column)

- \`NN-LABEL.i2t.bin\` — every byte the initiator sent, TCP-reassembled (starts with its first
  Login Request); \`NN-LABEL.t2i.bin\` — every byte the target sent. Whole PDUs only, never cut:
  each file is an exact concatenation of PDUs.
- \`NN-LABEL.tshark.tsv\` — tshark's independent decoding: a header line, then one line per
  PDU, first all i2t PDUs then all t2i PDUs, each in stream order. Columns:
  \`tcp.stream\`, \`dir\` (i2t/t2i), \`pdu_index\` (per direction), \`frame.number\`,
  \`offset\` and \`length\` (the PDU's byte range in the .bin, computed by
  \`interop/pcap2fixtures.py\` with the BHS length rule and checked against tshark's opcode
  and DataSegmentLength for every PDU), then tshark fields by their display-filter names.
  Values are tshark's \`show\` strings (numbers in decimal or 0x-hex as tshark prints them,
  booleans 0/1, ISID as colon hex); a field that occurs several times in one PDU (e.g.
  \`iscsi.keyvalue\`) is joined with \`|\`; an absent field is empty. \`_ws.malformed\` = 1
  when tshark flagged the frame (known artifact: a VPD 0x83 truncated by a short allocation
  length). HeaderDigest values are present only in the hdigest-* sessions; libiscsi never
  offers DataDigest, so no fixture has data digests.

| connection | tool (command run by the script) | i2t bytes | t2i bytes | PDUs |
|---|---|---|---|---|
EOF
    while IFS=$'\t' read -r name i2t t2i pdus; do
        label=${name#*-}
        label=${label%-discovery}
        case $label in
            ls) tool='`iscsi-ls -s iscsi://HOST:PORT` (SendTargets, then a normal session: REPORT LUNS, INQUIRY, READ CAPACITY)' ;;
            inq) tool='`iscsi-inq URL` (standard INQUIRY)' ;;
            inq-vpd00) tool='`iscsi-inq -e 1 -c 0 URL` (INQUIRY VPD page 0x00)' ;;
            readcapacity16) tool='`iscsi-readcapacity16 URL`' ;;
            swp) tool='`iscsi-swp URL` (MODE SENSE)' ;;
            rw) tool='`interop/libiscsi_rw.py` (libiscsi via ctypes): TEST UNIT READY, NOP-Out/NOP-In with 16 bytes of ping data, WRITE(10) 64 blocks at LBA 0 (immediate data + R2T + Data-Out), READ(10) of them (several Data-In)' ;;
            cu-write10-residuals) tool='`iscsi-test-cu -d -t ALL.iSCSIResiduals.Write10Residuals`' ;;
            cu-read10-residuals) tool='`iscsi-test-cu -d -t ALL.iSCSIResiduals.Read10Residuals`' ;;
            rw-beyond-eol) tool='`interop/libiscsi_rw.py --blocks 2 --lba 131071 --expect-check-condition`: WRITE(10)/READ(10) across the end of the LUN, CHECK CONDITION with ILLEGAL REQUEST sense' ;;
            cu-tmf-abort) tool='`iscsi-test-cu -d -t ALL.iSCSITMF.AbortTaskSimpleAsync` (Task Management ABORT TASK)' ;;
            hdigest-inq) tool='`iscsi-inq "URL_HD?header_digest=crc32c"` (HeaderDigest=CRC32C)' ;;
            hdigest-rw) tool='`interop/libiscsi_rw.py --header-digest --nop` on URL_HD: NOP, 24 blocks at LBA 4096, header digests on every PDU after login' ;;
            *) tool='?' ;;
        esac
        case $name in *-discovery) tool="$tool — discovery session" ;; esac
        echo "| \`$name\` | $tool | ${i2t#i2t=} | ${t2i#t2i=} | ${pdus#pdus=} |"
    done <"$tmp/summary.tsv"
    cat <<EOF

iscsi-test-cu runs open several connections per test (one to probe the LUN, then the test's
own sessions); each is its own NN file set. URL = \`iscsi://127.0.0.1:PORT/$IQN/1\`,
URL_HD = \`iscsi://127.0.0.1:PORT/$IQN_HD/1\`.
EOF
} >"$out/README.md"

echo "fixtures written to $out ($(du -sh "$out" | cut -f1))" >&2
