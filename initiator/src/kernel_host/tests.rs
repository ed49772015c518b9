use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

const HEADER: &str = include_str!("../../kmod/blockwire_scsi.h");

/// `#define NAME VALUE` lines of the C header whose value is a number or a
/// product of numbers.
fn defines() -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for line in HEADER.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(rest)) = (words.next(), Some(words.collect::<Vec<_>>().join(" ")))
        else {
            continue;
        };
        let value = rest.split("/*").next().unwrap_or("").trim();
        let value = value.trim_start_matches('(').trim_end_matches(')');
        let product: Option<u64> = value
            .split('*')
            .map(|f| {
                let f = f.trim();
                match f.strip_prefix("0x") {
                    Some(hex) => u64::from_str_radix(hex, 16).ok(),
                    None => f.parse().ok(),
                }
            })
            .try_fold(1u64, |acc, f| f.map(|f| acc * f));
        if let Some(v) = product {
            out.insert(name.to_owned(), v);
        }
    }
    out
}

/// Field offsets and the size of `struct NAME` in the header, by C's
/// layout rules for `__u8`..`__u64` fields and arrays of them (the only
/// kinds the header uses).
fn layout(name: &str) -> (HashMap<String, usize>, usize) {
    let defs = defines();
    let start = HEADER
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("struct {name} in the header"));
    let body = &HEADER[start..];
    let body = &body[body.find('{').expect("{") + 1..body.find("};").expect("};")];
    let (mut offset, mut align_max) = (0usize, 1usize);
    let mut fields = HashMap::new();
    for line in body.lines() {
        let decl = line.split("/*").next().unwrap_or("").trim();
        let Some(decl) = decl.strip_suffix(';') else {
            continue;
        };
        let (ty, field) = decl.split_once(' ').expect("type and field");
        let size = match ty {
            "__u8" | "char" => 1,
            "__u16" => 2,
            "__u32" => 4,
            "__u64" => 8,
            other => panic!("type {other} in struct {name}"),
        };
        let (field, count) = match field.split_once('[') {
            Some((f, n)) => {
                let n = n.trim_end_matches(']');
                let count = n
                    .parse::<usize>()
                    .ok()
                    .or_else(|| defs.get(n).map(|&v| v as usize))
                    .unwrap_or_else(|| panic!("array length {n}"));
                (f, count)
            }
            None => (field, 1),
        };
        offset = offset.div_ceil(size) * size;
        fields.insert(field.trim().to_owned(), offset);
        offset += size * count;
        align_max = align_max.max(size);
    }
    (fields, offset.div_ceil(align_max) * align_max)
}

#[test]
fn constants_agree_with_the_c_header() {
    let d = defines();
    assert_eq!(d["BW_SCSI_ABI_VERSION"], u64::from(ABI_VERSION));
    assert_eq!(d["BW_SCSI_MAX_CDB"], MAX_CDB as u64);
    assert_eq!(d["BW_SCSI_MAX_SENSE"], MAX_SENSE as u64);
    assert_eq!(d["BW_SCSI_SLOT_BYTES"], SLOT_BYTES as u64);
    assert_eq!(d["BW_SCSI_MAX_QUEUE_DEPTH"], u64::from(MAX_QUEUE_DEPTH));
    assert_eq!(d["BW_SCSI_MIN_IO_BYTES"], u64::from(MIN_IO_BYTES));
    assert_eq!(d["BW_SCSI_MAX_IO_BYTES"], u64::from(MAX_IO_BYTES));
    assert_eq!(d["BW_SCSI_MAX_AREA_BYTES"], MAX_AREA_BYTES);
    assert_eq!(d["BW_SCSI_IOC_MAGIC"], IOC_MAGIC);
    for (name, v) in [
        ("BW_SCSI_EV_COMMAND", 1),
        ("BW_SCSI_EV_ABORT", 2),
        ("BW_SCSI_EV_LUN_RESET", 3),
        ("BW_SCSI_EV_TARGET_RESET", 4),
        ("BW_SCSI_EV_HOST_RESET", 5),
        ("BW_SCSI_RE_COMMAND", 1),
        ("BW_SCSI_RE_TMF", 2),
        ("BW_SCSI_TMF_DONE", 0),
        ("BW_SCSI_TMF_FAILED", 1),
        ("BW_SCSI_DIR_NONE", 0),
        ("BW_SCSI_DIR_TO_DEVICE", 1),
        ("BW_SCSI_DIR_FROM_DEVICE", 2),
        ("BW_SCSI_HOST_OK", 0),
        ("BW_SCSI_HOST_RETRY", 1),
        ("BW_SCSI_HOST_NO_CONNECT", 2),
        ("BW_SCSI_HOST_ERROR", 3),
    ] {
        assert_eq!(d[name], v, "{name}");
    }
    // _IOWR / _IO of asm-generic/ioctl.h with the header's magic and numbers.
    assert!(HEADER.contains("_IOWR(BW_SCSI_IOC_MAGIC, 1, struct bw_scsi_attach)"));
    assert!(HEADER.contains("_IO(BW_SCSI_IOC_MAGIC, 2)"));
    assert_eq!(IOC_ATTACH, 0xc100_b701);
    assert_eq!(IOC_DETACH, 0xb702);
}

#[test]
fn structures_agree_with_the_c_header() {
    let (slot, slot_size) = layout("bw_scsi_slot");
    assert_eq!(slot_size, SLOT_USED_BYTES);
    for (field, at) in [
        ("lun", SLOT_LUN),
        ("data_len", SLOT_DATA_LEN),
        ("dir", SLOT_DIR),
        ("cdb_len", SLOT_CDB_LEN),
        ("cdb", SLOT_CDB),
        ("seq", SLOT_SEQ),
        ("status", SLOT_STATUS),
        ("host_status", SLOT_HOST_STATUS),
        ("sense_len", SLOT_SENSE_LEN),
        ("resid", SLOT_RESID),
        ("sense", SLOT_SENSE),
    ] {
        assert_eq!(slot[field], at, "bw_scsi_slot.{field}");
    }
    let (ev, ev_size) = layout("bw_scsi_event");
    assert_eq!(ev_size, EVENT_BYTES);
    assert_eq!(
        [ev["kind"], ev["tag"], ev["seq"], ev["tmf_id"], ev["lun"]],
        [0, 4, 8, 12, 16]
    );
    let (re, re_size) = layout("bw_scsi_reply");
    assert_eq!(re_size, REPLY_BYTES);
    assert_eq!(
        [re["kind"], re["tag"], re["seq"], re["result"]],
        [0, 4, 8, 12]
    );
    let (at, at_size) = layout("bw_scsi_attach");
    assert_eq!(at_size, ATTACH_BYTES);
    assert_eq!(
        [
            at["abi_version"],
            at["queue_depth"],
            at["max_io_bytes"],
            at["host_no"],
            at["area_bytes"],
            at["slot_bytes"],
            at["data_offset"],
            at["target"]
        ],
        [0, 4, 8, 12, 16, 20, 24, 32]
    );
}

fn answer_for(req: &AttachRequest, host_no: u32) -> [u8; ATTACH_BYTES] {
    let mut b = req.encode();
    put32(&mut b, 12, host_no);
    put32(&mut b, 16, req.area_bytes() as u32);
    put32(&mut b, 20, SLOT_BYTES as u32);
    put32(&mut b, 24, data_offset(req.queue_depth) as u32);
    b
}

#[test]
fn attach_requests_are_checked_before_the_ioctl() {
    let ok = AttachRequest {
        queue_depth: 32,
        max_io_bytes: 256 << 10,
        target: "iqn.2026-11.io.blockwire:disk".into(),
    };
    assert_eq!(ok.check(), Ok(()));
    assert_eq!(ok.area_bytes(), 8192 + 32 * (256 << 10));
    let a = Attached::decode(&answer_for(&ok, 7), &ok).expect("a usable answer");
    assert_eq!((a.host_no, a.data_offset), (7, 8192));
    for bad in [
        (0, 4096),
        (257, 4096),
        (8, 4095),
        (8, 2 << 20),
        (256, 1 << 20),
    ] {
        let r = AttachRequest {
            queue_depth: bad.0,
            max_io_bytes: bad.1,
            target: String::new(),
        };
        assert!(r.check().is_err(), "{bad:?} passed");
    }
    // An answer whose buffers would run past the area is refused.
    let mut short = answer_for(&ok, 7);
    put32(&mut short, 16, 4096);
    assert!(Attached::decode(&short, &ok).is_err());
    let long_name = AttachRequest {
        target: "x".repeat(400),
        ..ok
    };
    let b = long_name.encode();
    assert_eq!(b[32 + TARGET_NAME_BYTES - 1], 0, "the name keeps its NUL");
}

#[test]
fn slots_with_impossible_fields_are_refused() {
    let mut slot = vec![0u8; SLOT_BYTES];
    let cmd = SlotCommand {
        lun: 3,
        data_len: 4096,
        dir: Direction::FromDevice,
        cdb: vec![0x28, 0, 0, 0, 0, 0, 0, 0, 8, 0],
        seq: 9,
    };
    cmd.encode_into(&mut slot);
    assert_eq!(SlotCommand::decode(&slot, 4096), Ok(cmd.clone()));
    assert!(matches!(
        SlotCommand::decode(&slot, 2048),
        Err(KernelHostError::DataLength { .. })
    ));
    let mut s = slot.clone();
    s[SLOT_CDB_LEN] = 17;
    assert_eq!(
        SlotCommand::decode(&s, 4096),
        Err(KernelHostError::CdbLength(17))
    );
    s[SLOT_CDB_LEN] = 0;
    assert_eq!(
        SlotCommand::decode(&s, 4096),
        Err(KernelHostError::CdbLength(0))
    );
    let mut s = slot.clone();
    s[SLOT_DIR] = 3;
    assert_eq!(
        SlotCommand::decode(&s, 4096),
        Err(KernelHostError::Direction(3))
    );
    let mut s = slot.clone();
    s[SLOT_DIR] = 0;
    assert!(
        SlotCommand::decode(&s, 4096).is_err(),
        "data without a direction"
    );
    assert!(matches!(
        SlotCommand::decode(&slot[..100], 4096),
        Err(KernelHostError::Short { .. })
    ));
    assert_eq!(
        Event::decode(&[9; EVENT_BYTES]),
        Err(KernelHostError::EventKind(0x0909_0909))
    );
}

#[test]
fn luns_map_from_peripheral_and_flat_addressing() {
    assert_eq!(iscsi_lun(0), Some(0));
    assert_eq!(iscsi_lun(255), Some(255));
    assert_eq!(iscsi_lun(0x4000 | 300), Some(300));
    assert_eq!(iscsi_lun(256), None);
    assert_eq!(iscsi_lun(0x8000), None);
    assert_eq!(iscsi_lun(1 << 40), None);
}

fn direction() -> impl Strategy<Value = Direction> {
    prop_oneof![
        Just(Direction::None),
        Just(Direction::ToDevice),
        Just(Direction::FromDevice)
    ]
}

fn host_status() -> impl Strategy<Value = HostStatus> {
    prop_oneof![
        Just(HostStatus::Ok),
        Just(HostStatus::Retry),
        Just(HostStatus::NoConnect),
        Just(HostStatus::Error)
    ]
}

proptest! {
    #[test]
    fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..300),
                                       max_io in 0u32..(2 << 20)) {
        if let Ok(c) = SlotCommand::decode(&bytes, max_io) {
            prop_assert!((1..=MAX_CDB).contains(&c.cdb.len()));
            prop_assert!(c.data_len <= max_io);
            prop_assert!(c.dir != Direction::None || c.data_len == 0);
        }
        let _ = Event::decode(&bytes);
    }

    #[test]
    fn slot_commands_round_trip(lun in any::<u64>(), dir in direction(), len in 0u32..=(1 << 20),
                                cdb in proptest::collection::vec(any::<u8>(), 1..=16),
                                seq in any::<u32>()) {
        let len = if dir == Direction::None { 0 } else { len };
        let cmd = SlotCommand { lun, data_len: len, dir, cdb, seq };
        let mut slot = vec![0xa5u8; SLOT_BYTES];
        cmd.encode_into(&mut slot);
        prop_assert_eq!(SlotCommand::decode(&slot, MAX_IO_BYTES), Ok(cmd));
    }

    #[test]
    fn answers_round_trip_and_keep_the_command(host in host_status(), status in any::<u8>(),
                                               sense in proptest::collection::vec(any::<u8>(), 0..200),
                                               resid in any::<u32>()) {
        let cmd = SlotCommand { lun: 1, data_len: 512, dir: Direction::ToDevice, cdb: vec![0x2a; 10], seq: 4 };
        let mut slot = vec![0u8; SLOT_BYTES];
        cmd.encode_into(&mut slot);
        let a = SlotAnswer { host, status, sense: sense.clone(), resid };
        a.write_into(&mut slot);
        let back = SlotAnswer::read_from(&slot);
        prop_assert_eq!(back.host, host);
        prop_assert_eq!(back.status, status);
        prop_assert_eq!(&back.sense[..], &sense[..sense.len().min(MAX_SENSE)]);
        prop_assert_eq!(back.resid, resid);
        prop_assert_eq!(SlotCommand::decode(&slot, 4096), Ok(cmd), "the answer overwrote the command");
    }

    #[test]
    fn events_round_trip(kind in prop_oneof![Just(EventKind::Command), Just(EventKind::Abort),
                                             Just(EventKind::LunReset), Just(EventKind::TargetReset),
                                             Just(EventKind::HostReset)],
                         tag in any::<u32>(), seq in any::<u32>(), tmf_id in any::<u32>(), lun in any::<u64>()) {
        let e = Event { kind, tag, seq, tmf_id, lun };
        prop_assert_eq!(Event::decode(&e.encode()), Ok(e));
    }

    #[test]
    fn replies_say_what_the_driver_reads(tag in any::<u32>(), seq in any::<u32>(), done in any::<bool>()) {
        let c = Reply::Command { tag, seq }.encode();
        prop_assert_eq!([get32(&c, 0), get32(&c, 4), get32(&c, 8)], [1, tag, seq]);
        let t = Reply::Tmf { tmf_id: seq, done }.encode();
        prop_assert_eq!([get32(&t, 0), get32(&t, 8), get32(&t, 12)], [2, seq, u32::from(!done)]);
    }
}
