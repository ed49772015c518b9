#!/bin/bash
# interop/test-durability.sh — acknowledged writes survive kill -9 of blockwire-target.
#
# A real blockwire-target serves two file LUNs (LUN 0 cached mode, LUN 1 direct mode /
# O_DIRECT) with [fabric] state_dir set. Through libiscsi (ctypes) an initiator:
#   - writes regions with WRITE(16) FUA=1,
#   - writes regions with plain WRITE(10) and then SYNCHRONIZE CACHE(10),
#   - writes regions with plain WRITE(16) and then SYNCHRONIZE CACHE(16),
#   - registers a key with APTPL=1 and reserves WRITE EXCLUSIVE,
# and the moment the last status arrives the target gets SIGKILL (no shutdown flush).
# The target restarts on the same files and the same state_dir; a new session must read
# back exactly the acknowledged data (also checked in the files themselves), and READ KEYS /
# READ RESERVATION must show the APTPL registration and reservation.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib/blockwire.sh"

IQN=iqn.2026-11.io.blockwire:durability
INI=iqn.2026-11.io.blockwire:durability-initiator
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bw-durability.XXXXXX")
pid=""
cleanup() {
    if [ -n "$pid" ]; then stop_blockwire "$pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

cat >"$tmp/target.toml" <<TOML
[fabric]
state_dir = "$tmp/state"

[[portal_group]]
tag = 1
listen = ["127.0.0.1:3260"]

[[target]]
name = "$IQN"

[[target.lun]]
id = 0
backstore = "file"
path = "$tmp/cached.img"
size = "64M"
mode = "cached"

[[target.lun]]
id = 1
backstore = "file"
path = "$tmp/direct.img"
size = "64M"
mode = "direct"
TOML

cat >"$tmp/durability.py" <<'PY'
import ctypes, hashlib, json, os, random, sys

phase, portal, iqn, ini, state = sys.argv[1:6]
BS = 512
lib = ctypes.CDLL("libiscsi.so.7")
vp, cp, i, u32, u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
lib.iscsi_create_context.restype = vp
lib.iscsi_create_context.argtypes = [cp]
lib.iscsi_get_error.restype = cp
lib.iscsi_get_error.argtypes = [vp]
lib.iscsi_set_targetname.argtypes = [vp, cp]
lib.iscsi_set_session_type.argtypes = [vp, i]
lib.iscsi_full_connect_sync.argtypes = [vp, cp, i]
for name, args in {
    "iscsi_testunitready_sync": [vp, i],
    "iscsi_write16_sync": [vp, i, u64, cp, u32, i, i, i, i, i, i],
    "iscsi_write10_sync": [vp, i, u32, cp, u32, i, i, i, i, i, i],
    "iscsi_synchronizecache10_sync": [vp, i, i, i, i, i],
    "iscsi_synchronizecache16_sync": [vp, i, u64, u32, i, i],
    "iscsi_persistent_reserve_out_sync": [vp, i, i, i, i, vp],
    "iscsi_persistent_reserve_in_sync": [vp, i, i, i],
}.items():
    getattr(lib, name).restype = vp
    getattr(lib, name).argtypes = args

class Iov(ctypes.Structure):
    _fields_ = [("iov_base", vp), ("iov_len", ctypes.c_size_t)]

class ProutBasic(ctypes.Structure):
    _fields_ = [("reservation_key", u64), ("service_action_reservation_key", u64),
                ("spec_i_pt", ctypes.c_uint8), ("all_tg_pt", ctypes.c_uint8),
                ("aptpl", ctypes.c_uint8)]

lib.iscsi_read10_iov_sync.restype = vp
lib.iscsi_read10_iov_sync.argtypes = [vp, i, u32, u32, i, i, i, i, i, i, ctypes.POINTER(Iov), i]
lib.scsi_datain_unmarshall.restype = vp
lib.scsi_datain_unmarshall.argtypes = [vp]
lib.scsi_free_scsi_task.argtypes = [vp]

def session(lun):
    ctx = lib.iscsi_create_context(ini.encode())
    lib.iscsi_set_targetname(ctx, iqn.encode())
    lib.iscsi_set_session_type(ctx, 2)
    if lib.iscsi_full_connect_sync(ctx, portal.encode(), lun) != 0:
        sys.exit(f"login: {lib.iscsi_get_error(ctx).decode()}")
    for _ in range(5):  # unit attentions (power on) first
        if status(ctx, lib.iscsi_testunitready_sync(ctx, lun), "TUR", quiet=True) == 0:
            return ctx
    sys.exit("TEST UNIT READY never GOOD")

def status(ctx, task, what, quiet=False):
    if not task:
        sys.exit(f"{what}: {lib.iscsi_get_error(ctx).decode()}")
    st = ctypes.cast(task, ctypes.POINTER(ctypes.c_int))[0]
    if st != 0 and not quiet:
        sys.exit(f"{what}: SCSI status {st:#x}")
    return st

def read(ctx, lun, lba, n):
    buf = ctypes.create_string_buffer(n)
    iov = Iov(ctypes.cast(buf, vp), n)
    t = lib.iscsi_read10_iov_sync(ctx, lun, lba, n, BS, 0, 0, 0, 0, 0, ctypes.byref(iov), 1)
    status(ctx, t, f"READ(10) LBA {lba}")
    lib.scsi_free_scsi_task(t)
    return buf.raw

KEY = 0x0d15ab1e0000cafe
if phase == "write":
    expect = {}
    rnd = random.Random(7)
    for lun in (0, 1):
        ctx = session(lun)
        regions = []
        for k in range(24):
            lba, n = rnd.randrange(0, 120000), rnd.choice([1, 7, 8, 64, 256])
            data = rnd.randbytes(n * BS)
            how = k % 3
            if how == 0:   # FUA
                status(ctx, lib.iscsi_write16_sync(ctx, lun, lba, data, len(data), BS, 0, 0, 1, 0, 0), "WRITE(16) FUA")
            elif how == 1:  # WRITE(10), then SYNCHRONIZE CACHE(10) of the range
                status(ctx, lib.iscsi_write10_sync(ctx, lun, lba, data, len(data), BS, 0, 0, 0, 0, 0), "WRITE(10)")
                status(ctx, lib.iscsi_synchronizecache10_sync(ctx, lun, lba, n, 0, 0), "SYNCHRONIZE CACHE(10)")
            else:          # WRITE(16), then SYNCHRONIZE CACHE(16) of the whole medium
                status(ctx, lib.iscsi_write16_sync(ctx, lun, lba, data, len(data), BS, 0, 0, 0, 0, 0), "WRITE(16)")
                status(ctx, lib.iscsi_synchronizecache16_sync(ctx, lun, 0, 0, 0, 0), "SYNCHRONIZE CACHE(16)")
            regions.append((lba, data.hex()))
        expect[lun] = regions
        if lun == 1:
            p = ProutBasic(0, KEY, 0, 0, 1)  # REGISTER, APTPL
            status(ctx, lib.iscsi_persistent_reserve_out_sync(ctx, lun, 0, 0, 0, ctypes.byref(p)), "PR REGISTER")
            p = ProutBasic(KEY, 0, 0, 0, 1)  # RESERVE, WRITE EXCLUSIVE
            status(ctx, lib.iscsi_persistent_reserve_out_sync(ctx, lun, 1, 0, 1, ctypes.byref(p)), "PR RESERVE")
        # No logout: the target is killed with the sessions up.
    json.dump(expect, open(state, "w"))
    print(f"acknowledged {sum(len(v) for v in expect.values())} writes on 2 LUNs + APTPL reservation")
else:
    expect = json.load(open(state))
    files = {0: sys.argv[6], 1: sys.argv[7]}
    for lun in (0, 1):
        ctx = session(lun)
        # Later regions may overlap earlier ones: apply in order to get the final image.
        final = {}
        for lba, hexdata in expect[str(lun)]:
            data = bytes.fromhex(hexdata)
            for b in range(len(data) // BS):
                final[lba + b] = data[b * BS:(b + 1) * BS]
        bad = [lba for lba, blk in final.items() if read(ctx, lun, lba, BS) != blk]
        with open(files[lun], "rb") as f:
            bad_file = [lba for lba, blk in final.items() if os.pread(f.fileno(), BS, lba * BS) != blk]
        if bad or bad_file:
            sys.exit(f"LUN {lun}: {len(bad)} blocks differ through iSCSI, {len(bad_file)} in the file")
        print(f"LUN {lun} ({'cached' if lun == 0 else 'direct'}): {len(final)} acknowledged blocks read back identical (iSCSI and file)", flush=True)
    t = lib.iscsi_persistent_reserve_in_sync(ctx, 1, 0, 256)   # READ KEYS
    status(ctx, t, "PR IN READ KEYS")
    # struct scsi_persistent_reserve_in_read_keys { uint32_t prgeneration;
    #   uint32_t additional_length; int num_keys; uint64_t keys[0]; }  (keys at offset 16)
    rk = lib.scsi_datain_unmarshall(t)
    raw = ctypes.string_at(rk, 24)
    nkeys = int.from_bytes(raw[8:12], sys.byteorder)
    key0 = int.from_bytes(raw[16:24], sys.byteorder) if nkeys else 0
    if nkeys != 1 or key0 != KEY:
        sys.exit(f"READ KEYS after restart: {nkeys} keys, first {key0:#x}")
    print(f"APTPL registration survived kill -9: key {key0:#x}")
PY

port=$(free_port)
pid=$(start_blockwire "$port" "$tmp" "$tmp/target.toml")
python3 "$tmp/durability.py" write "127.0.0.1:$port" "$IQN" "$INI" "$tmp/expect.json"
kill -KILL "$pid"
_wait_gone 5 "$pid" || true
echo "  blockwire-target $pid killed with SIGKILL"
pid=""
pid=$(start_blockwire "$port" "$tmp" "$tmp/target.toml")
python3 "$tmp/durability.py" verify "127.0.0.1:$port" "$IQN" "$INI" "$tmp/expect.json" \
    "$tmp/cached.img" "$tmp/direct.img"
stop_blockwire "$pid"
pid=""
echo "test-durability: PASS"
