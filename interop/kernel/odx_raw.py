#!/usr/bin/env python3
"""Token-based copy (ODX) commands sent exactly as SBC-3 lays them out, through sg3_utils'
sg_raw (SCSI pass-through on the kernel initiator's /dev/sdX). Runs inside the kernel lab
guest (interop/kernel/guest-offload.sh).

  odx_raw.py populate DEV LIST_ID TOKEN_FILE LBA:BLOCKS[,LBA:BLOCKS...]
      POPULATE TOKEN, then RECEIVE ROD TOKEN INFORMATION; writes the 512-byte token to
      TOKEN_FILE and prints "status S transfer N" (S: COPY OPERATION STATUS).
  odx_raw.py write DEV LIST_ID TOKEN_FILE OFFSET LBA:BLOCKS[,...] [del]
      WRITE USING TOKEN from OFFSET (blocks into the token), DEL_TKN with "del", then
      RECEIVE ROD TOKEN INFORMATION; prints "status S transfer N".
Exit status: 0 when the command completed GOOD; 3 with the sense sg_raw printed otherwise.
"""
import struct
import subprocess
import sys
import tempfile


def ranges_of(spec):
    out = b""
    for r in spec.split(","):
        lba, n = r.split(":")
        out += struct.pack(">QI4x", int(lba), int(n))
    return out


def sg_raw(dev, cdb, data_out=None, data_in=0):
    args = ["sg_raw", "-t", "120"]
    with tempfile.NamedTemporaryFile() as f_out, tempfile.NamedTemporaryFile() as f_in:
        if data_out is not None:
            f_out.write(data_out)
            f_out.flush()
            args += ["-s", str(len(data_out)), "-i", f_out.name]
        if data_in:
            args += ["-r", str(data_in), "-o", f_in.name]
        args += [dev] + ["%02x" % b for b in cdb]
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode != 0:
            sys.stdout.write(" ".join(l.strip() for l in (p.stdout + p.stderr).splitlines() if l.strip()) + "\n")
            sys.exit(3)
        return f_in.read() if data_in else b""


def cdb16(op, sa, list_id_at, list_id, len_value):
    c = bytearray(16)
    c[0], c[1] = op, sa
    c[list_id_at:list_id_at + 4] = struct.pack(">I", list_id)
    c[10:14] = struct.pack(">I", len_value)
    return bytes(c)


def rrti(dev, list_id):
    """RECEIVE ROD TOKEN INFORMATION: (status, transfer count, token or None)."""
    d = sg_raw(dev, cdb16(0x84, 0x07, 2, list_id, 1024), data_in=1024)
    status, count = d[5] & 0x7F, struct.unpack(">Q", d[16:24])[0]
    at = 32 + d[13]
    tlen = struct.unpack(">I", d[at:at + 4])[0]
    token = d[at + 6:at + 6 + 512] if tlen >= 514 else None
    return status, count, token


def main():
    cmd, dev, list_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if cmd == "populate":
        token_file, spec = sys.argv[4], sys.argv[5]
        rl = ranges_of(spec)
        p = struct.pack(">HBBIIHH", 14 + len(rl), 0, 0, 0, 0, 0, len(rl)) + rl
        sg_raw(dev, cdb16(0x83, 0x10, 6, list_id, len(p)), data_out=p)
        status, count, token = rrti(dev, list_id)
        if token is None:
            print(f"status {status:#x} transfer {count}: no token returned")
            sys.exit(3)
        with open(token_file, "wb") as f:
            f.write(token)
    elif cmd == "write":
        token_file, offset, spec = sys.argv[4], int(sys.argv[5]), sys.argv[6]
        flags = 0x02 if sys.argv[7:8] == ["del"] else 0
        with open(token_file, "rb") as f:
            token = f.read()
        rl = ranges_of(spec)
        p = struct.pack(">HB5xQ", 534 + len(rl), flags, offset) + token + bytes(6) + struct.pack(">H", len(rl)) + rl
        sg_raw(dev, cdb16(0x83, 0x11, 6, list_id, len(p)), data_out=p)
        status, count, _ = rrti(dev, list_id)
    else:
        sys.exit(f"unknown command {cmd}")
    print(f"status {status:#x} transfer {count}")


main()
