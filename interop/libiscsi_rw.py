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
