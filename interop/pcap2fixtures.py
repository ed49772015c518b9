#!/usr/bin/env python3
"""Turn a pcapng of iSCSI sessions into golden fixtures for blockwire's PDU codec.

For every TCP connection (tcp.stream N) in the capture it writes, into OUTDIR:
  NN-LABEL.i2t.bin     reassembled bytes initiator -> target (tshark "follow,tcp,raw")
  NN-LABEL.t2i.bin     reassembled bytes target -> initiator
  NN-LABEL.tshark.tsv  tshark's own decoding of every iSCSI PDU of that connection (the
                       independent oracle), one line per PDU, i2t PDUs first then t2i,
                       each direction in stream order, with a header line of field names
NN counts the connections that carried iSCSI bytes, in capture order (the tcp.stream
number is in the TSV). LABEL is the label of the tool run that opened the connection (from --runs), with
"-discovery" appended for SendTargets discovery sessions.

The PDU boundaries in the .bin files are cross-checked against tshark: each direction is
walked with the BHS length rule (48 + 4*TotalAHSLength + header digest + DataSegmentLength
padded to 4 + data digest) and every PDU's opcode and DataSegmentLength must equal tshark's.
The `offset` and `length` columns come from that walk (they are not tshark fields).

usage: pcap2fixtures.py --pcap F --port P --runs RUNS.tsv --outdir D
RUNS.tsv: lines "LABEL<TAB>unix-start-time", in run order.
"""
import argparse
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

# The TSV columns after the converter's own (stream, dir, pdu_index, frame, offset, length).
# Every field is a tshark display-filter field name; several occurrences in one PDU (e.g.
# several key=value pairs) are joined with "|". Missing fields are empty.
FIELDS = [
    # Basic header segment, all opcodes
    "iscsi.opcode", "iscsi.I", "iscsi.flags", "iscsi.totalahslength",
    "iscsi.datasegmentlength", "scsi.lun", "iscsi.initiatortasktag",
    "iscsi.targettransfertag", "iscsi.cmdsn", "iscsi.expstatsn", "iscsi.statsn",
    "iscsi.expcmdsn", "iscsi.maxcmdsn",
    # SCSI Command
    "iscsi.scsicommand.F", "iscsi.scsicommand.R", "iscsi.scsicommand.W",
    "iscsi.scsicommand.attr", "iscsi.scsicommand.expecteddatatransferlength",
    # SCSI Response
    "iscsi.scsiresponse.o", "iscsi.scsiresponse.u", "iscsi.scsiresponse.O",
    "iscsi.scsiresponse.U", "iscsi.scsiresponse.response", "iscsi.scsiresponse.status",
    "iscsi.scsiresponse.residualcount", "iscsi.scsiresponse.bidireadresidualcount",
    "iscsi.scsiresponse.senselength",
    # Data-In / Data-Out / R2T / SNACK
    "iscsi.scsidata.F", "iscsi.scsidata.A", "iscsi.scsidata.S", "iscsi.scsidata.O",
    "iscsi.scsidata.U", "iscsi.scsidata.readresidualcount", "iscsi.datasn",
    "iscsi.bufferOffset", "iscsi.r2tsn", "iscsi.desireddatalength", "iscsi.expdatasn",
    # Login / Text / Logout
    "iscsi.versionmax", "iscsi.versionmin", "iscsi.versionactive", "iscsi.cid",
    "iscsi.isid", "iscsi.tsih", "iscsi.login.T", "iscsi.login.C", "iscsi.login.csg",
    "iscsi.login.nsg", "iscsi.login.status", "iscsi.text.F", "iscsi.text.C",
    "iscsi.keyvalue", "iscsi.logout.reason", "iscsi.logout.response", "iscsi.time2wait",
    "iscsi.time2retain",
    # Task management, async, reject
    "iscsi.taskmanfun.function", "iscsi.taskmanfun.response",
    "iscsi.taskmanfun.referencedtasktag", "iscsi.refcmdsn", "iscsi.asyncevent",
    "iscsi.reject.reason",
    # Digests
    "iscsi.headerdigest32", "iscsi.datadigest32",
    # SCSI layer as tshark decodes it (CDB on commands, status/sense on responses)
    "scsi.spc.opcode", "scsi_sbc.opcode", "scsi_sbc.rdwr6.lba", "scsi_sbc.rdwr6.xferlen",
    "scsi_sbc.rdwr10.lba", "scsi_sbc.rdwr10.xferlen", "scsi_sbc.rdwr12.lba",
    "scsi_sbc.rdwr12.xferlen", "scsi_sbc.rdwr16.lba", "scsi_sbc.rdwr16.xferlen",
    "scsi.inquiry.evpd.pagecode", "scsi.cdb.alloclen", "scsi.cdb.alloclen16",
    "scsi.status", "scsi.sns.key", "scsi.sns.asc", "scsi.sns.ascq",
    # tshark's verdict on the frame
    "_ws.malformed",
]
COLUMNS = ["tcp.stream", "dir", "pdu_index", "frame.number", "offset", "length"] + FIELDS
WANTED = set(FIELDS)


def run(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def decode_opts(port):
    return ["-d", f"tcp.port=={port},iscsi", "-o", f"iscsi.target_ports:{port}",
            "-o", "iscsi.bogus_pdu_max_data_len:16777215"]


def follow_raw(pcap, stream, port):
    """(i2t bytes, t2i bytes) of one TCP stream."""
    out = run(["tshark", "-r", pcap, "-q", "-z", f"follow,tcp,raw,{stream}"])
    nodes, chunks = {}, {0: [], 1: []}
    body = False
    for line in out.splitlines():
        # Layout: "=====", Follow:, Filter:, Node 0:, Node 1:, hex lines..., "=====".
        if line.startswith("Node 0:") or line.startswith("Node 1:"):
            nodes[int(line[5])] = int(line.rsplit(":", 1)[1])
            body = len(nodes) == 2
            continue
        if line.startswith("====="):
            body = False
            continue
        if not body or not line.strip():
            continue
        # Node 0's data is not indented, node 1's is indented with a tab.
        chunks[1 if line.startswith("\t") else 0].append(bytes.fromhex(line.strip()))
    if not chunks[0] and not chunks[1]:
        return b"", b""
    if len(nodes) != 2 or port not in nodes.values():
        raise SystemExit(f"stream {stream}: cannot tell the target node: {nodes}")
    tnode = 0 if nodes[0] == port else 1
    return b"".join(chunks[1 - tnode]), b"".join(chunks[tnode])


def walk_fields(elem, rec):
    """Collect wanted fields (recursively) of one proto element into rec."""
    for f in elem.iter("field"):
        name = f.get("name")
        if name in WANTED:
            v = f.get("show", "").replace("\t", " ").replace("\n", " ")
            vals = rec.setdefault(name, [])
            # tshark repeats some fields in one PDU (scsi.lun in the iscsi and scsi trees,
            # the command's opcode as a generated field): keep distinct values only, except
            # for key=value pairs, which are kept in order, repeats and all.
            if name == "iscsi.keyvalue" or v not in vals:
                vals.append(v)


def pdml_pdus(pcap, port):
    """Yield one dict per iSCSI PDU, in frame order, with stream/srcport/frame attached."""
    p = subprocess.Popen(["tshark", "-r", pcap] + decode_opts(port) + ["-T", "pdml"],
                         stdout=subprocess.PIPE)
    for _, pkt in ET.iterparse(p.stdout, events=("end",)):
        if pkt.tag != "packet":
            continue
        frame = stream = srcport = None
        cur = None
        pdus = []
        for proto in pkt.findall("proto"):
            name = proto.get("name")
            if name == "frame":
                frame = int(proto.find("field[@name='frame.number']").get("show"))
            elif name == "tcp":
                stream = int(proto.find("field[@name='tcp.stream']").get("show"))
                srcport = int(proto.find("field[@name='tcp.srcport']").get("show"))
            elif name == "iscsi":
                cur = {}
                walk_fields(proto, cur)
                pdus.append(cur)
            elif cur is not None:
                # What tshark lists after an iscsi proto belongs to that PDU: its SCSI layer
                # ("scsi"), its flags (PDML puts iscsi.flags of some opcodes in a
                # "fake-field-wrapper"), "_ws.malformed". (A fake-field-wrapper *before* the
                # first iscsi proto holds TCP reassembly fields and is skipped.)
                if name == "_ws.malformed":
                    cur.setdefault("_ws.malformed", []).append("1")
                walk_fields(proto, cur)
        for rec in pdus:
            rec["_frame"], rec["_stream"], rec["_srcport"] = frame, stream, srcport
            yield rec
        pkt.clear()
    if p.wait() != 0:
        raise SystemExit("tshark -T pdml failed")


def first_int(rec, name):
    v = rec.get(name)
    if not v:
        return None
    return int(v[0], 0)


def walk_bin(data, pdus, where):
    """Split a direction's bytes into PDUs; check them against tshark; return (off, len)s."""
    spans, off = [], 0
    for idx, rec in enumerate(pdus):
        if off + 48 > len(data):
            raise SystemExit(f"{where}: PDU {idx}: stream ends inside a BHS")
        bhs = data[off:off + 48]
        opcode = bhs[0] & 0x3F
        ahs = bhs[4] * 4
        dsl = int.from_bytes(bhs[5:8], "big")
        hd = 4 if "iscsi.headerdigest32" in rec else 0
        dd = 4 if "iscsi.datadigest32" in rec else 0
        length = 48 + ahs + hd + ((dsl + 3) & ~3) + (dd if dsl else 0)
        t_op, t_dsl = first_int(rec, "iscsi.opcode"), first_int(rec, "iscsi.datasegmentlength")
        if t_op != opcode or (t_dsl is not None and t_dsl != dsl):
            raise SystemExit(f"{where}: PDU {idx} at {off}: bytes say opcode {opcode:#x} "
                             f"dsl {dsl}, tshark says {t_op} {t_dsl}")
        spans.append((off, length))
        off += length
    if off != len(data):
        raise SystemExit(f"{where}: {len(data) - off} bytes after the last PDU tshark saw")
    return spans


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pcap", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--runs", required=True)
    ap.add_argument("--outdir", required=True)
    a = ap.parse_args()

    runs = []
    with open(a.runs) as f:
        for line in f:
            label, t = line.rstrip("\n").split("\t")
            runs.append((float(t), label))

    # Each stream's SYN time -> the tool run that opened it.
    starts = {}
    for line in run(["tshark", "-r", a.pcap, "-Y", "tcp.flags.syn==1 && tcp.flags.ack==0",
                     "-T", "fields", "-e", "tcp.stream", "-e", "frame.time_epoch"]).splitlines():
        s, t = line.split("\t")
        starts.setdefault(int(s), float(t))

    by_stream = {}
    for rec in pdml_pdus(a.pcap, a.port):
        by_stream.setdefault(rec["_stream"], []).append(rec)

    os.makedirs(a.outdir, exist_ok=True)
    written = []
    nn = 0
    for stream in sorted(starts):
        recs = by_stream.get(stream, [])
        i2t, t2i = follow_raw(a.pcap, stream, a.port)
        if not i2t and not t2i:
            continue  # capture-start probe: connect + close, no iSCSI
        label = None
        for t, l in runs:
            if t <= starts[stream]:
                label = l
        if label is None:
            raise SystemExit(f"stream {stream} starts before the first run")
        if any("SessionType=Discovery" in kv for r in recs for kv in r.get("iscsi.keyvalue", [])):
            label += "-discovery"
        base = os.path.join(a.outdir, f"{nn:02d}-{label}")
        nn += 1
        lines = ["\t".join(COLUMNS)]
        for dname, data, pred in (("i2t", i2t, lambda r: r["_srcport"] != a.port),
                                  ("t2i", t2i, lambda r: r["_srcport"] == a.port)):
            pdus = [r for r in recs if pred(r)]
            spans = walk_bin(data, pdus, f"{base}.{dname}")
            for idx, (rec, (off, length)) in enumerate(zip(pdus, spans)):
                row = [str(stream), dname, str(idx), str(rec["_frame"]), str(off), str(length)]
                row += ["|".join(rec.get(fn, [])) for fn in FIELDS]
                lines.append("\t".join(row))
            with open(f"{base}.{dname}.bin", "wb") as f:
                f.write(data)
        with open(f"{base}.tshark.tsv", "w") as f:
            f.write("\n".join(lines) + "\n")
        written.append((os.path.basename(base), len(i2t), len(t2i), len(lines) - 1))
    for name, n1, n2, npdu in written:
        print(f"{name}\ti2t={n1}\tt2i={n2}\tpdus={npdu}")


if __name__ == "__main__":
    main()
