#!/usr/bin/env python3
"""Atomic writes through a Linux block device (pwritev2 with RWF_ATOMIC, O_DIRECT), for
interop/kernel/guest-atomic.sh.

  atomic_io.py once DEV OFFSET LEN
      one RWF_ATOMIC write of LEN bytes at OFFSET, read back; exit 0 when it landed,
      2 with the errno name when the kernel refused it.
  atomic_io.py writer DEV UNITS WRITERS INDEX OUT
      writer INDEX of WRITERS: loops over its units (u % WRITERS == INDEX) of UNITS 16 KiB
      units, each pass one generation higher, every unit written with one RWF_ATOMIC
      pwritev2 of its stamp (every 16-byte row = unit+1, generation). Stops on SIGTERM and
      writes OUT: per unit the last generation acknowledged and the last attempted.
  atomic_io.py check DEV UNITS OUT...
      reads every unit (O_DIRECT) and prints one line per finding; exit 1 when a unit is torn
      (rows of different generations or units) or holds a generation neither acknowledged
      last nor attempted after it (an acknowledged atomic write lost or an old one back).
"""
import errno
import json
import mmap
import os
import signal
import struct
import sys

RWF_ATOMIC = 0x40  # include/uapi/linux/fs.h, Linux 6.11+
UNIT = 16 << 10
ROW = 16


def stamp(unit, gen):
    return struct.pack("<QQ", unit + 1, gen) * (UNIT // ROW)


def aligned(n):
    return mmap.mmap(-1, n)


def once(dev, offset, length):
    fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
    buf = aligned(length)
    pattern = bytes((i * 13 + 7) % 251 for i in range(length))
    buf[:] = pattern
    try:
        n = os.pwritev(fd, [buf], offset, RWF_ATOMIC)
    except OSError as e:
        print(f"pwritev2(RWF_ATOMIC) {length} bytes at {offset}: {errno.errorcode.get(e.errno, e.errno)}")
        return 2
    back = aligned(length)
    os.preadv(fd, [back], offset)
    os.close(fd)
    ok = n == length and back[:] == pattern
    print(f"pwritev2(RWF_ATOMIC) {length} bytes at {offset}: wrote {n}, read back {'equal' if ok else 'DIFFERENT'}")
    return 0 if ok else 1


def writer(dev, units, writers, index, out):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
    buf = aligned(UNIT)
    mine = [u for u in range(units) if u % writers == index]
    acked = {u: 0 for u in mine}
    tried = {u: 0 for u in mine}
    errors = {}
    gen = 0
    while not stop:
        gen += 1
        for u in mine:
            if stop:
                break
            buf[:] = stamp(u, gen)
            tried[u] = gen
            try:
                n = os.pwritev(fd, [buf], u * UNIT, RWF_ATOMIC)
                if n == UNIT:
                    acked[u] = gen
            except OSError as e:
                name = errno.errorcode.get(e.errno, str(e.errno))
                errors[name] = errors.get(name, 0) + 1
    os.close(fd)
    with open(out + ".tmp", "w") as f:
        json.dump({"acked": acked, "tried": tried, "errors": errors, "passes": gen}, f)
    os.rename(out + ".tmp", out)


def check(dev, units, outs):
    acked, tried, errors, writes = {}, {}, {}, 0
    for o in outs:
        with open(o) as f:
            d = json.load(f)
        acked.update({int(k): v for k, v in d["acked"].items()})
        tried.update({int(k): v for k, v in d["tried"].items()})
        for k, v in d["errors"].items():
            errors[k] = errors.get(k, 0) + v
        writes += sum(d["acked"].values())
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    buf = aligned(UNIT)
    torn = stale = 0
    gens = []
    for u in range(units):
        os.preadv(fd, [buf], u * UNIT)
        rows = {bytes(buf[i:i + ROW]) for i in range(0, UNIT, ROW)}
        if len(rows) != 1:
            seen = sorted({struct.unpack("<QQ", r) for r in rows})[:4]
            print(f"TORN unit {u}: {len(rows)} different rows, e.g. (unit+1, gen) {seen}")
            torn += 1
            continue
        unit1, gen = struct.unpack("<QQ", rows.pop())
        if (unit1, gen) != (0, 0) and unit1 != u + 1:
            print(f"WRONG unit {u}: holds the stamp of unit {unit1 - 1}")
            torn += 1
            continue
        gens.append(gen)
        if gen not in (acked.get(u, 0), tried.get(u, 0)):
            print(f"STALE unit {u}: generation {gen}, last acknowledged {acked.get(u)}, last attempted {tried.get(u)}")
            stale += 1
    os.close(fd)
    print(f"{units} units of {UNIT >> 10} KiB: {torn} torn, {stale} not the last acknowledged or attempted; "
          f"generations {min(gens) if gens else '-'}..{max(gens) if gens else '-'}; "
          f"~{writes} atomic writes acknowledged; write errors seen by the writers: {errors or 'none'}")
    return 1 if torn or stale else 0


def main(argv):
    cmd = argv[1]
    if cmd == "once":
        return once(argv[2], int(argv[3]), int(argv[4]))
    if cmd == "writer":
        writer(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), argv[6])
        return 0
    if cmd == "check":
        return check(argv[2], int(argv[3]), argv[4:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
