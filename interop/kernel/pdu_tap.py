#!/usr/bin/env python3
"""An iSCSI TCP relay that reads every PDU between an initiator and a target and checks the
target's task management (RFC 7143 11.5/11.6, SAM-5 7):

  - every TMF request gets a TMF response, and how long it took;
  - once the target has answered "Function complete" to ABORT TASK (for the referenced task),
    to ABORT TASK SET / CLEAR TASK SET / LUN RESET (for the tasks of that LUN), or to TARGET
    WARM/COLD RESET (for every task), it never again sends a Data-In, R2T or SCSI Response
    for such a task (unless the initiator reuses the ITT for a new command).

It relays bytes unchanged; it frames PDUs from the BHS alone (48-byte header, TotalAHSLength,
DataSegmentLength, padding), so it needs HeaderDigest=None and DataDigest=None, which the test
that runs it sets. Unlike a packet capture it cannot miss a segment: it is the TCP path.

  pdu_tap.py LISTEN_PORT TARGET_HOST:PORT REPORT_FILE
  pdu_tap.py --self-test     plants each fault in a synthetic PDU stream and checks it is caught

On SIGUSR1 it resets every relayed connection (a failed network path). On SIGTERM it writes a summary to REPORT_FILE (and stdout) and exits 0; the caller decides
pass or fail from the summary's `violations` and `unanswered` lines.
"""
import asyncio
import signal
import sys
import time

SCSI_CMD, TMF_REQ = 0x01, 0x02
SCSI_RSP, TMF_RSP, DATA_IN, R2T = 0x21, 0x22, 0x25, 0x31
TMF_NAMES = {1: "ABORT TASK", 2: "ABORT TASK SET", 3: "CLEAR ACA", 4: "CLEAR TASK SET",
             5: "LUN RESET", 6: "TARGET WARM RESET", 7: "TARGET COLD RESET", 8: "TASK REASSIGN"}
RSP_NAMES = {0: "Function complete", 1: "Task does not exist", 2: "LUN does not exist",
             3: "Task still allegiant", 4: "Reassignment not supported", 5: "Not supported",
             6: "Authorization failed", 255: "Function rejected"}


class Stats:
    def __init__(self):
        self.commands = 0
        self.tmfs = []          # (conn, function, response, seconds)
        self.violations = []    # text
        self.unanswered = []    # text
        self.connections = 0
        self.log = []


STATS = Stats()
LIVE = set()  # (initiator writer, target writer) of each relayed connection


class Conn:
    """One TCP connection's task state, as both directions' PDUs pass."""

    def __init__(self, n):
        self.n = n
        self.active = {}        # ITT -> LUN (8 raw bytes) of commands not yet finished
        self.aborted = {}       # ITT -> why
        self.pending_tmf = {}   # TMF ITT -> (function, LUN, RTT, t0)

    def note(self, text):
        STATS.log.append(f"{time.strftime('%T')} conn {self.n}: {text}")

    def from_initiator(self, bhs):
        op = bhs[0] & 0x3F
        itt = bytes(bhs[16:20])
        if op == SCSI_CMD:
            STATS.commands += 1
            self.active[itt] = bytes(bhs[8:16])
            self.aborted.pop(itt, None)
        elif op == TMF_REQ:
            fn = bhs[1] & 0x7F
            self.pending_tmf[itt] = (fn, bytes(bhs[8:16]), bytes(bhs[20:24]), time.monotonic())
            self.note(f"TMF request {TMF_NAMES.get(fn, fn)} itt={itt.hex()} rtt={bhs[20:24].hex()} "
                      f"({len(self.active)} tasks active)")

    def from_target(self, bhs):
        op = bhs[0] & 0x3F
        itt = bytes(bhs[16:20])
        if op in (SCSI_RSP, DATA_IN, R2T):
            if itt in self.aborted:
                STATS.violations.append(
                    f"conn {self.n}: opcode 0x{op:02x} for itt={itt.hex()} after {self.aborted[itt]}")
            if op == SCSI_RSP or (op == DATA_IN and bhs[1] & 0x01):  # response, or Data-In with S
                self.active.pop(itt, None)
        elif op == TMF_RSP:
            req = self.pending_tmf.pop(itt, None)
            if req is None:
                STATS.violations.append(f"conn {self.n}: TMF response for unknown itt={itt.hex()}")
                return
            fn, lun, rtt, t0 = req
            rsp = bhs[2]
            dt = time.monotonic() - t0
            STATS.tmfs.append((self.n, fn, rsp, dt))
            self.note(f"TMF response {TMF_NAMES.get(fn, fn)}: {RSP_NAMES.get(rsp, rsp)} after {dt:.3f} s")
            if rsp != 0:
                return
            why = f"{TMF_NAMES.get(fn, fn)} answered Function complete"
            if fn == 1:
                victims = [rtt] if rtt in self.active else []
            elif fn in (2, 4, 5):
                victims = [t for t, tl in self.active.items() if tl == lun]
            elif fn in (6, 7):
                victims = list(self.active)
            else:
                victims = []
            for t in victims:
                self.active.pop(t, None)
                self.aborted[t] = why

    def closed(self):
        for itt, (fn, _lun, _rtt, t0) in self.pending_tmf.items():
            STATS.unanswered.append(
                f"conn {self.n}: {TMF_NAMES.get(fn, fn)} itt={itt.hex()} unanswered "
                f"when the connection ended {time.monotonic() - t0:.1f} s later")
        self.pending_tmf.clear()


async def pump(reader, writer, on_pdu):
    """Relay bytes; call on_pdu(bhs) for each PDU header as it passes."""
    buf = bytearray()
    skip = 0
    while True:
        data = await reader.read(1 << 18)
        if not data:
            break
        writer.write(data)
        view = memoryview(data)
        i = 0
        while i < len(view):
            if skip:
                k = min(skip, len(view) - i)
                skip -= k
                i += k
                continue
            need = 48 - len(buf)
            buf += view[i:i + need]
            i += min(need, len(view) - i)
            if len(buf) == 48:
                on_pdu(buf)
                ahs = buf[4] * 4
                dsl = int.from_bytes(buf[5:8], "big")
                skip = ahs + dsl + (-dsl % 4)
                buf = bytearray()
        await writer.drain()
    try:
        writer.close()
    except Exception:
        pass


async def handle(reader, writer, target):
    STATS.connections += 1
    conn = Conn(STATS.connections)
    host, port = target.rsplit(":", 1)
    try:
        treader, twriter = await asyncio.open_connection(host, int(port))
    except OSError as e:
        conn.note(f"cannot reach the target: {e}")
        writer.close()
        return
    conn.note("connected")
    pair = (writer, twriter)
    LIVE.add(pair)
    a = asyncio.create_task(pump(reader, twriter, conn.from_initiator))
    b = asyncio.create_task(pump(treader, writer, conn.from_target))
    await asyncio.wait([a, b], return_when=asyncio.FIRST_COMPLETED)
    for t in (a, b):
        t.cancel()
    for w in (writer, twriter):
        try:
            w.close()
        except Exception:
            pass
    LIVE.discard(pair)
    conn.closed()
    conn.note("closed")


def cut_all():
    """SIGUSR1: the network path fails: every relayed connection is reset at once, both ways,
    as a dead link or a pulled cable would leave it (the initiator sees a connection error)."""
    STATS.log.append(f"{time.strftime('%T')} SIGUSR1: cutting {len(LIVE)} connection(s)")
    for pair in list(LIVE):
        for w in pair:
            w.transport.abort()


def summary():
    lines = [f"connections {STATS.connections}", f"scsi_commands {STATS.commands}"]
    by = {}
    for _n, fn, rsp, dt in STATS.tmfs:
        k = f"{TMF_NAMES.get(fn, fn)} -> {RSP_NAMES.get(rsp, rsp)}"
        c, m = by.get(k, (0, 0.0))
        by[k] = (c + 1, max(m, dt))
    for k, (c, m) in sorted(by.items()):
        lines.append(f"tmf {k}: {c} (slowest {m:.3f} s)")
    lines.append(f"tmf_slowest_seconds {max((t[3] for t in STATS.tmfs), default=0.0):.3f}")
    lines.append(f"unanswered {len(STATS.unanswered)}")
    lines += [f"  {u}" for u in STATS.unanswered]
    lines.append(f"violations {len(STATS.violations)}")
    lines += [f"  {v}" for v in STATS.violations[:20]]
    lines.append("events:")
    lines += [f"  {e}" for e in STATS.log[-200:]]
    return "\n".join(lines) + "\n"


def self_test():
    """The checker must catch the faults it exists for: a SCSI Response after ABORT TASK's
    Function complete, a Data-In after LUN RESET, a TMF left unanswered; and must not flag an
    ITT the initiator reused for a new command."""
    def bhs(op, itt, lun=0, b1=0x80, b2=0, rtt=b"\xff" * 4):
        h = bytearray(48)
        h[0], h[1], h[2] = op, b1, b2
        h[8:16] = lun.to_bytes(8, "big")
        h[16:20] = itt
        h[20:24] = rtt
        return h
    c = Conn(99)
    c.from_initiator(bhs(SCSI_CMD, b"\0\0\0\1"))
    c.from_initiator(bhs(SCSI_CMD, b"\0\0\0\2", lun=1))
    c.from_initiator(bhs(TMF_REQ, b"\0\0\0\9", b1=0x81, rtt=b"\0\0\0\1"))
    c.from_target(bhs(TMF_RSP, b"\0\0\0\9", b2=0))
    c.from_target(bhs(SCSI_RSP, b"\0\0\0\1"))
    assert len(STATS.violations) == 1, STATS.violations
    c.from_initiator(bhs(SCSI_CMD, b"\0\0\0\1"))           # ITT reused: a new task
    c.from_target(bhs(SCSI_RSP, b"\0\0\0\1"))
    assert len(STATS.violations) == 1, STATS.violations
    c.from_initiator(bhs(TMF_REQ, b"\0\0\0\8", lun=1, b1=0x85))
    c.from_target(bhs(TMF_RSP, b"\0\0\0\8", b2=0))
    c.from_target(bhs(DATA_IN, b"\0\0\0\2", lun=1, b1=0x00))
    assert len(STATS.violations) == 2, STATS.violations
    c.from_initiator(bhs(TMF_REQ, b"\0\0\0\7", b1=0x86))
    c.closed()
    assert len(STATS.unanswered) == 1, STATS.unanswered
    print("pdu_tap self-test: caught 2 violations and 1 unanswered TMF, as planted")


async def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    port, target, report = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    server = await asyncio.start_server(lambda r, w: handle(r, w, target), "127.0.0.1", port)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, cut_all)
    print(f"pdu_tap listening on 127.0.0.1:{port} -> {target}", flush=True)
    await stop.wait()
    server.close()
    text = summary()
    with open(report, "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    asyncio.run(main())
