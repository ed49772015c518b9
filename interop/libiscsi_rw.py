#!/usr/bin/env python3
"""Small WRITE(10) + READ(10) through libiscsi itself (ctypes, libiscsi.so.7), one session.

libiscsi-bin ships no read/write tool with a bounded transfer size (iscsi-perf reads until
interrupted, iscsi-test-cu's Read10/Write10.Simple move ~16-33 MiB), so this drives the
library directly: login, TEST UNIT READY, WRITE(10) of N blocks at LBA, READ(10) of the same
blocks, compare, logout. With the target's default MaxRecvDataSegmentLength (tgtd: 8192) a
32 KiB write produces immediate data + R2T + Data-Out PDUs, and the read several Data-In PDUs.

usage: libiscsi_rw.py PORTAL IQN LUN [--blocks N] [--lba L] [--header-digest] [--nop]
                     [--expect-check-condition] [--initiator NAME]
exit 0 on success, 1 on any unexpected SCSI status, iSCSI error or data mismatch.

Bulk modes (instead of the small WRITE(10)/READ(10) above), all WRITE(16)/READ(16) through
libiscsi's async API with --qd commands in flight, each of --xfer bytes (default 1 MiB):
  --write-from FILE             write FILE's bytes to the LUN from --lba on
  --read-to FILE --length N     read N bytes from --lba on into FILE
  --bench randread|randwrite|seqread|seqwrite --seconds S [--span BYTES]
                                run the workload for S seconds over the first --span bytes
                                (default: 1 GiB) and print one line
                                `bench MODE xfer=.. qd=.. ios=.. secs=.. iops=.. MBps=..`
Header digest: libiscsi negotiates HeaderDigest=CRC32C when asked (--header-digest), but it
never offers DataDigest (it has no data-digest code), so no libiscsi tool can turn data
digests on.
"""
import argparse
import ctypes
import select
import sys
import time

ISCSI_SESSION_NORMAL = 2
ISCSI_HEADER_DIGEST_NONE = 0
ISCSI_HEADER_DIGEST_CRC32C = 3
SCSI_STATUS_GOOD = 0
SCSI_STATUS_CHECK_CONDITION = 2
BLOCK = 512


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("portal")
    ap.add_argument("iqn")
    ap.add_argument("lun", type=int)
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--lba", type=int, default=0)
    ap.add_argument("--header-digest", action="store_true")
    ap.add_argument("--nop", action="store_true",
                    help="after TEST UNIT READY, a NOP-Out with 16 bytes of ping data")
    ap.add_argument("--expect-check-condition", action="store_true",
                    help="WRITE and READ must fail with CHECK CONDITION (e.g. beyond the end)")
    ap.add_argument("--initiator", default="iqn.2026-11.io.blockwire:golden-initiator")
    ap.add_argument("--write-from", metavar="FILE")
    ap.add_argument("--read-to", metavar="FILE")
    ap.add_argument("--length", type=int, help="bytes to read with --read-to")
    ap.add_argument("--bench", choices=["randread", "randwrite", "seqread", "seqwrite"])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--span", type=int, default=1 << 30,
                    help="bytes of the LUN (from LBA 0) that --bench touches")
    ap.add_argument("--xfer", type=int, default=1 << 20, help="bytes per command (bulk modes)")
    ap.add_argument("--qd", type=int, default=8, help="commands in flight (bulk modes)")
    ap.add_argument("--block-size", type=int, default=BLOCK)
    a = ap.parse_args()

    lib = ctypes.CDLL("libiscsi.so.7")
    vp, cp, u32, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int
    lib.iscsi_create_context.restype = vp
    lib.iscsi_create_context.argtypes = [cp]
    lib.iscsi_get_error.restype = cp
    lib.iscsi_get_error.argtypes = [vp]
    for f in ("iscsi_set_targetname",):
        getattr(lib, f).argtypes = [vp, cp]
    lib.iscsi_set_session_type.argtypes = [vp, i]
    lib.iscsi_set_header_digest.argtypes = [vp, i]
    lib.iscsi_full_connect_sync.argtypes = [vp, cp, i]
    lib.iscsi_testunitready_sync.restype = vp
    lib.iscsi_testunitready_sync.argtypes = [vp, i]
    # struct scsi_task *iscsi_write10_sync(ctx, lun, lba, data, datalen, blocksize,
    #                                      wrprotect, dpo, fua, fua_nv, group_number)
    lib.iscsi_write10_sync.restype = vp
    lib.iscsi_write10_sync.argtypes = [vp, i, u32, cp, u32, i, i, i, i, i, i]
    # struct scsi_task *iscsi_read10_iov_sync(ctx, lun, lba, datalen, blocksize, rdprotect,
    #     dpo, fua, fua_nv, group_number, struct scsi_iovec *iov, int niov)
    # (the _iov_ variant reads into our buffer: no need to know struct scsi_task's layout)
    lib.iscsi_read10_iov_sync.restype = vp
    lib.iscsi_read10_iov_sync.argtypes = [vp, i, u32, u32, i, i, i, i, i, i,
                                          ctypes.POINTER(ScsiIovec), i]
    lib.scsi_free_scsi_task.argtypes = [vp]
    lib.iscsi_logout_sync.argtypes = [vp]
    lib.iscsi_destroy_context.argtypes = [vp]

    ctx = lib.iscsi_create_context(a.initiator.encode())
    if not ctx:
        sys.exit("iscsi_create_context failed")

    def err(what):
        print(f"{what}: {lib.iscsi_get_error(ctx).decode(errors='replace')}", file=sys.stderr)
        sys.exit(1)

    lib.iscsi_set_targetname(ctx, a.iqn.encode())
    lib.iscsi_set_session_type(ctx, ISCSI_SESSION_NORMAL)
    lib.iscsi_set_header_digest(
        ctx, ISCSI_HEADER_DIGEST_CRC32C if a.header_digest else ISCSI_HEADER_DIGEST_NONE)
    if lib.iscsi_full_connect_sync(ctx, a.portal.encode(), a.lun) != 0:
        err("login")

    def status(task, what, want=SCSI_STATUS_GOOD):
        if not task:
            err(what)
        # struct scsi_task starts with `int status`.
        st = ctypes.cast(task, ctypes.POINTER(ctypes.c_int))[0]
        if st != want:
            print(f"{what}: SCSI status {st:#x}, expected {want:#x}", file=sys.stderr)
            sys.exit(1)

    rw_want = SCSI_STATUS_CHECK_CONDITION if a.expect_check_condition else SCSI_STATUS_GOOD

    bulk = a.write_from or a.read_to or a.bench
    if bulk:
        # A new session may first get a unit attention (e.g. POWER ON OCCURRED): retry.
        for attempt in range(3):
            t = lib.iscsi_testunitready_sync(ctx, a.lun)
            if not t:
                err("TEST UNIT READY")
            st = ctypes.cast(t, ctypes.POINTER(ctypes.c_int))[0]
            lib.scsi_free_scsi_task(t)
            if st == SCSI_STATUS_GOOD:
                break
        else:
            sys.exit(f"TEST UNIT READY: SCSI status {st:#x} three times")
        bulk_mode(lib, ctx, a, err)
        lib.iscsi_logout_sync(ctx)
        lib.iscsi_destroy_context(ctx)
        return

    t = lib.iscsi_testunitready_sync(ctx, a.lun)
    status(t, "TEST UNIT READY")
    lib.scsi_free_scsi_task(t)

    if a.nop:
        nop_out(lib, ctx, err)

    n = a.blocks * BLOCK
    # A recognisable pattern: each 512-byte block starts with its LBA, then a byte ramp.
    pattern = bytearray()
    for b in range(a.blocks):
        blk = bytearray(((a.lba + b).to_bytes(4, "big") + bytes(range(256)) * 2)[:BLOCK])
        pattern += blk
    t = lib.iscsi_write10_sync(ctx, a.lun, a.lba, bytes(pattern), n, BLOCK, 0, 0, 0, 0, 0)
    status(t, "WRITE(10)", rw_want)
    lib.scsi_free_scsi_task(t)

    buf = ctypes.create_string_buffer(n)
    iov = ScsiIovec(ctypes.cast(buf, ctypes.c_void_p), n)
    t = lib.iscsi_read10_iov_sync(ctx, a.lun, a.lba, n, BLOCK, 0, 0, 0, 0, 0,
                                  ctypes.byref(iov), 1)
    status(t, "READ(10)", rw_want)
    lib.scsi_free_scsi_task(t)
    if a.expect_check_condition:
        print(f"WRITE(10) and READ(10) of {a.blocks} blocks at LBA {a.lba}: CHECK CONDITION")
    elif buf.raw != bytes(pattern):
        print("READ(10) returned different data than written", file=sys.stderr)
        sys.exit(1)
    else:
        print(f"wrote and read back {a.blocks} blocks at LBA {a.lba}: data matches")

    lib.iscsi_logout_sync(ctx)
    lib.iscsi_destroy_context(ctx)


CMD_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def bulk_mode(lib, ctx, a, err):
    """--write-from / --read-to / --bench: keep a.qd WRITE(16)/READ(16) of a.xfer in flight.

    At 4 KiB and qd 32 this loop, not the target, sets the pace: one Python thread pays for
    libiscsi, the ctypes calls into it and back, and its socket's loopback TCP. So the work per
    command is kept to one task call, one completion callback and one task free; everything
    else (the poll set, the functions, the iovec pointers) is made once per run.
    """
    import os
    import random

    vp, i, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
    # The two per-command calls, made below without declared argtypes (see queue_task):
    # struct scsi_task *iscsi_read16_iov_task(ctx, lun, uint64_t lba, uint32_t datalen,
    #     blocksize, rdprotect, dpo, fua, fua_nv, group_number, cb, void *private_data,
    #     struct scsi_iovec *iov, int niov)
    # struct scsi_task *iscsi_write16_iov_task(ctx, lun, uint64_t lba, unsigned char *data,
    #     uint32_t datalen, blocksize, wrprotect, dpo, fua, fua_nv, group_number, cb,
    #     void *private_data, struct scsi_iovec *iov, int niov)
    # (the unnamed ones are int)
    lib.iscsi_get_fd.argtypes = [vp]
    lib.iscsi_which_events.argtypes = [vp]
    lib.iscsi_service.argtypes = [vp, i]

    bs, xfer, qd = a.block_size, a.xfer, max(1, a.qd)
    if xfer % bs:
        sys.exit(f"--xfer {xfer} is not a multiple of the block size {bs}")
    fd = None
    if a.write_from:
        fd = os.open(a.write_from, os.O_RDONLY)
        total = os.fstat(fd).st_size
        kind = "write"
    elif a.read_to:
        if a.length is None:
            sys.exit("--read-to needs --length")
        fd = os.open(a.read_to, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        total = a.length
        kind = "read"
    else:
        kind = "read" if a.bench.endswith("read") else "write"
        total = None
    if total is not None and total % bs:
        sys.exit(f"length {total} is not a multiple of the block size {bs}")

    slots = [ctypes.create_string_buffer(xfer) for _ in range(qd)]
    if a.bench and kind == "write":
        rnd = random.Random(1)
        for b in slots:
            b.raw = rnd.randbytes(xfer)
    iovs = [ScsiIovec(ctypes.cast(b, ctypes.c_void_p), xfer) for b in slots]
    iov_refs = [ctypes.byref(v) for v in iovs]
    views = [memoryview(b) for b in slots]
    # Per slot: (byte offset, length) of the command in flight, or None.
    busy = [None] * qd
    in_flight = ios = moved = next_seq = 0
    fail = None
    stop = False
    span_units = max(1, a.span // xfer)
    # random() scaled to the span: a fraction of randrange's cost, uniform to 2^-53.
    uniform = random.Random(2).random
    base = a.lba * bs
    bench_rand = bool(a.bench) and a.bench.startswith("rand")
    monotonic = time.monotonic
    deadline = monotonic() + a.seconds if a.bench else None
    lun = a.lun
    # The per-command call declares no argtypes: converting 15 declared arguments costs more
    # than the call itself. So every argument that is not a C int goes in already typed: the
    # context and each slot's private value as void pointers, the LBA as a 64-bit integer.
    queue_task = lib.iscsi_write16_iov_task if kind == "write" else lib.iscsi_read16_iov_task
    queue_task.restype = vp
    ctx_arg = vp(ctx)
    slot_args = [vp(s + 1) for s in range(qd)]
    free_task = lib.scsi_free_scsi_task

    def next_piece():
        """(offset, length) of the next command, or None when there is nothing left."""
        nonlocal next_seq
        if stop or fail:
            return None
        if deadline is not None:
            if monotonic() >= deadline:
                return None
            if bench_rand:
                return (int(uniform() * span_units) * xfer, xfer)
            off = (next_seq % span_units) * xfer
            next_seq += 1
            return (off, xfer)
        off = next_seq
        if off >= total:
            return None
        n = min(xfer, total - off)
        next_seq = off + n
        return (base + off, n)

    def submit(slot):
        nonlocal in_flight, fail
        piece = next_piece()
        busy[slot] = piece
        if piece is None:
            return
        off, n = piece
        if n != xfer:
            # Only the last piece of --write-from/--read-to is short; no slot is used after it.
            iovs[slot].iov_len = n
        if kind == "write":
            if fd is not None:
                got = os.preadv(fd, [views[slot][:n]], off - base)
                if got != n:
                    fail = f"short read of {a.write_from} at {off - base}"
                    busy[slot] = None
                    return
            t = queue_task(ctx_arg, lun, u64(off // bs), None, n, bs, 0, 0, 0, 0, 0,
                           cbf, slot_args[slot], iov_refs[slot], 1)
        else:
            t = queue_task(ctx_arg, lun, u64(off // bs), n, bs, 0, 0, 0, 0, 0,
                           cbf, slot_args[slot], iov_refs[slot], 1)
        if not t:
            fail = f"queueing {kind} at byte {off}: " + \
                lib.iscsi_get_error(ctx).decode(errors="replace")
            busy[slot] = None
            return
        in_flight += 1

    def cb(_ctx, status, task, priv):
        nonlocal in_flight, ios, moved, fail
        slot = priv - 1
        off, n = busy[slot]
        busy[slot] = None
        in_flight -= 1
        if task:
            free_task(task)
        if status != SCSI_STATUS_GOOD:
            fail = (f"{kind.upper()}(16) of {n} bytes at LBA {off // bs}: status "
                    f"{status:#x}: " + lib.iscsi_get_error(ctx).decode(errors="replace"))
            return
        if kind == "read" and fd is not None:
            os.pwrite(fd, views[slot][:n], off - base)
        ios += 1
        moved += n
        submit(slot)

    cbf = CMD_CB(cb)
    t0 = monotonic()
    for s in range(qd):
        submit(s)
    # One poll set for the whole run: libiscsi's socket changes only on a reconnect, and the
    # events it waits for (POLLOUT while PDUs are queued) are re-armed only when they change.
    service, which_events, get_fd = lib.iscsi_service, lib.iscsi_which_events, lib.iscsi_get_fd
    poller = select.poll()
    sock, events = get_fd(ctx), which_events(ctx)
    poller.register(sock, events)
    # Generous bound: no single wait for the target may exceed 60 s.
    while in_flight:
        ev = poller.poll(60000)
        if not ev:
            sys.exit(f"{kind}: no progress for 60 s ({in_flight} commands in flight)")
        for _fd, revents in ev:
            if service(ctx, revents) < 0:
                err(f"{kind} service")
        if fail:
            stop = True
        now_sock, now_events = get_fd(ctx), which_events(ctx)
        if now_sock != sock:
            poller.unregister(sock)
            poller.register(now_sock, now_events)
            sock, events = now_sock, now_events
        elif now_events != events:
            poller.modify(sock, now_events)
            events = now_events
    secs = monotonic() - t0
    if fd is not None:
        os.close(fd)
    if fail:
        print(fail, file=sys.stderr)
        sys.exit(1)
    if a.bench:
        print(f"bench {a.bench} xfer={xfer} qd={qd} ios={ios} secs={secs:.3f} "
              f"iops={ios / secs:.0f} MBps={moved / secs / 1e6:.1f}")
    else:
        what = "wrote" if kind == "write" else "read"
        print(f"{what} {moved} bytes at LBA {a.lba} in {secs:.2f} s "
              f"({moved / secs / 1e6:.0f} MB/s, {xfer} bytes per command, qd {qd})")


def nop_out(lib, ctx, err):
    """NOP-Out (ping data "blockwire-ping!!") and wait for the NOP-In, via the async API."""
    CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    done = []

    def cb(_ctx, st, _data, _priv):
        done.append(st)

    cbf = CB(cb)
    lib.iscsi_nop_out_async.argtypes = [ctypes.c_void_p, CB, ctypes.c_char_p, ctypes.c_int,
                                        ctypes.c_void_p]
    lib.iscsi_get_fd.argtypes = [ctypes.c_void_p]
    lib.iscsi_which_events.argtypes = [ctypes.c_void_p]
    lib.iscsi_service.argtypes = [ctypes.c_void_p, ctypes.c_int]
    ping = b"blockwire-ping!!"
    if lib.iscsi_nop_out_async(ctx, cbf, ping, len(ping), None) != 0:
        err("NOP-Out")
    deadline = time.monotonic() + 10
    while not done:
        if time.monotonic() > deadline:
            sys.exit("NOP-Out: no NOP-In within 10 s")
        p = select.poll()
        p.register(lib.iscsi_get_fd(ctx), lib.iscsi_which_events(ctx))
        for _fd, revents in p.poll(1000):
            if lib.iscsi_service(ctx, revents) < 0:
                err("NOP-Out service")
    if done[0] != 0:
        sys.exit(f"NOP-Out: status {done[0]}")


class ScsiIovec(ctypes.Structure):
    # struct scsi_iovec mirrors struct iovec.
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


if __name__ == "__main__":
    main()
