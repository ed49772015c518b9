//! Golden tests: real traffic between libiscsi and tgtd, captured on this
//! machine by interop/capture-golden.sh, decoded here PDU by PDU and
//! compared field by field with tshark's independent decoding of the same
//! bytes (the .tshark.tsv next to each stream). Every PDU must also
//! re-encode to exactly the bytes it was decoded from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use blockwire_pdu::keys::parse_text;
use blockwire_pdu::pdu::Opcode;
use blockwire_pdu::scsi::{parse_sense_segment, Cdb};
use blockwire_pdu::{Bhs, Digests, Frame, FrameDecoder, Pdu, Stage};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tgtd-libiscsi")
}

/// One tshark row: field name -> value.
type Row = HashMap<String, String>;

fn read_tsv(path: &Path) -> Vec<Row> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    lines
        .map(|l| {
            header
                .iter()
                .zip(l.split('\t'))
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// A tshark number: decimal or 0x-hex.
fn num(v: &str) -> u64 {
    let v = v.trim();
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => v.parse().unwrap_or_else(|_| panic!("not a number: {v:?}")),
    }
}

/// The digests the target's login answers settled on.
fn negotiated_digests(target_stream: &[u8]) -> Digests {
    let mut negotiated = Digests::NONE;
    let mut at = 0;
    while let Ok(Frame::Pdu { pdu, consumed }) =
        FrameDecoder::new(16_777_215, Digests::NONE).decode(&target_stream[at..])
    {
        at += consumed;
        let Bhs::LoginResponse(r) = pdu.bhs else {
            break;
        };
        for (k, v) in parse_text(&pdu.data).unwrap() {
            negotiated.header |= k == "HeaderDigest" && v == "CRC32C";
            negotiated.data |= k == "DataDigest" && v == "CRC32C";
        }
        if r.transit && r.nsg == Stage::FullFeature {
            break;
        }
    }
    negotiated
}

/// Decodes a whole stream. Digests start after the login phase when the
/// login negotiated them (header digests in the hdigest-* captures).
fn decode_stream(bytes: &[u8], negotiated: Digests) -> Vec<(usize, usize, Pdu, Digests)> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut digests = Digests::NONE;
    while at < bytes.len() {
        let framer = FrameDecoder::new(16_777_215, digests);
        let Frame::Pdu { pdu, consumed } = framer.decode(&bytes[at..]).unwrap() else {
            panic!("stream ends in a partial PDU at {at}");
        };
        out.push((at, consumed, pdu.clone(), digests));
        at += consumed;
        let (transit, nsg) = match pdu.bhs {
            Bhs::LoginRequest(r) => (r.transit, r.nsg),
            Bhs::LoginResponse(r) => (r.transit, r.nsg),
            _ => continue,
        };
        if transit && nsg == Stage::FullFeature {
            digests = negotiated;
        }
    }
    out
}

/// Compares one field when tshark reported it.
static COMPARED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

macro_rules! check {
    ($row:expr, $field:expr, $ours:expr, $ctx:expr) => {
        if let Some(v) = $row.get($field) {
            COMPARED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            assert_eq!(num(v), u64::from($ours), "{}: field {}", $ctx, $field);
        }
    };
}

fn compare(row: &Row, pdu: &Pdu, ctx: &str) {
    let b = &pdu.bhs;
    check!(row, "iscsi.opcode", b.opcode() as u8, ctx);
    check!(row, "iscsi.datasegmentlength", pdu.data.len() as u32, ctx);
    check!(row, "iscsi.initiatortasktag", b.itt(), ctx);
    match b {
        Bhs::ScsiCommand(c) => {
            check!(row, "iscsi.I", c.immediate, ctx);
            check!(row, "iscsi.scsicommand.F", c.final_bit, ctx);
            check!(row, "iscsi.scsicommand.R", c.read, ctx);
            check!(row, "iscsi.scsicommand.W", c.write, ctx);
            check!(row, "iscsi.scsicommand.attr", c.attr.to_u8(), ctx);
            check!(
                row,
                "iscsi.scsicommand.expecteddatatransferlength",
                c.expected_data_transfer_length,
                ctx
            );
            check!(row, "iscsi.cmdsn", c.cmd_sn, ctx);
            check!(row, "iscsi.expstatsn", c.exp_stat_sn, ctx);
            check!(row, "scsi.lun", c.lun.index().unwrap(), ctx);
            let cdb = Cdb::decode(&pdu.full_cdb().unwrap()).unwrap();
            check!(row, "scsi_sbc.opcode", cdb.opcode(), ctx);
            if let Some(lba) = row.get("scsi_sbc.rdwr10.lba") {
                assert_eq!(cdb.lba_range().unwrap().0, num(lba), "{ctx}: LBA");
            }
            if let Some(len) = row.get("scsi_sbc.rdwr10.xferlen") {
                assert_eq!(
                    u64::from(cdb.lba_range().unwrap().1),
                    num(len),
                    "{ctx}: transfer length"
                );
            }
        }
        Bhs::ScsiResponse(r) => {
            check!(row, "iscsi.scsiresponse.o", r.bidi_read_overflow, ctx);
            check!(row, "iscsi.scsiresponse.u", r.bidi_read_underflow, ctx);
            check!(row, "iscsi.scsiresponse.O", r.overflow, ctx);
            check!(row, "iscsi.scsiresponse.U", r.underflow, ctx);
            check!(row, "iscsi.scsiresponse.response", r.response.to_u8(), ctx);
            check!(row, "iscsi.scsiresponse.status", r.status, ctx);
            check!(
                row,
                "iscsi.scsiresponse.residualcount",
                r.residual_count,
                ctx
            );
            check!(
                row,
                "iscsi.scsiresponse.bidireadresidualcount",
                r.bidi_read_residual_count,
                ctx
            );
            check!(row, "iscsi.statsn", r.stat_sn, ctx);
            check!(row, "iscsi.expcmdsn", r.exp_cmd_sn, ctx);
            check!(row, "iscsi.maxcmdsn", r.max_cmd_sn, ctx);
            check!(row, "iscsi.expdatasn", r.exp_data_sn, ctx);
            if let Some(len) = row.get("iscsi.scsiresponse.senselength") {
                assert_eq!(
                    num(len) as usize + 2,
                    pdu.data.len().min(num(len) as usize + 2),
                    "{ctx}"
                );
                let sense = parse_sense_segment(&pdu.data).unwrap().unwrap();
                check!(row, "scsi.sns.key", sense.key.code(), ctx);
                check!(row, "scsi.sns.asc", sense.code().asc, ctx);
                check!(row, "scsi.sns.ascq", sense.code().ascq, ctx);
            }
        }
        Bhs::DataIn(d) => {
            check!(row, "iscsi.scsidata.F", d.final_bit, ctx);
            check!(row, "iscsi.scsidata.A", d.acknowledge, ctx);
            check!(row, "iscsi.scsidata.S", d.status.is_some(), ctx);
            check!(row, "iscsi.scsidata.O", d.overflow, ctx);
            check!(row, "iscsi.scsidata.U", d.underflow, ctx);
            check!(
                row,
                "iscsi.scsidata.readresidualcount",
                d.residual_count,
                ctx
            );
            check!(row, "iscsi.datasn", d.data_sn, ctx);
            check!(row, "iscsi.bufferOffset", d.buffer_offset, ctx);
            check!(row, "iscsi.statsn", d.stat_sn, ctx);
            check!(row, "iscsi.expcmdsn", d.exp_cmd_sn, ctx);
            check!(row, "iscsi.maxcmdsn", d.max_cmd_sn, ctx);
            if let Some(s) = row.get("iscsi.scsiresponse.status") {
                assert_eq!(Some(num(s) as u8), d.status, "{ctx}: status");
            }
        }
        Bhs::DataOut(d) => {
            check!(row, "iscsi.scsidata.F", d.final_bit, ctx);
            check!(row, "iscsi.targettransfertag", d.ttt, ctx);
            check!(row, "iscsi.expstatsn", d.exp_stat_sn, ctx);
            check!(row, "iscsi.datasn", d.data_sn, ctx);
            check!(row, "iscsi.bufferOffset", d.buffer_offset, ctx);
        }
        Bhs::R2t(r) => {
            check!(row, "iscsi.targettransfertag", r.ttt, ctx);
            check!(row, "iscsi.statsn", r.stat_sn, ctx);
            check!(row, "iscsi.expcmdsn", r.exp_cmd_sn, ctx);
            check!(row, "iscsi.maxcmdsn", r.max_cmd_sn, ctx);
            check!(row, "iscsi.r2tsn", r.r2t_sn, ctx);
            check!(row, "iscsi.bufferOffset", r.buffer_offset, ctx);
            check!(
                row,
                "iscsi.desireddatalength",
                r.desired_data_transfer_length,
                ctx
            );
        }
        Bhs::LoginRequest(l) => {
            check!(row, "iscsi.login.T", l.transit, ctx);
            check!(row, "iscsi.login.C", l.continue_bit, ctx);
            check!(row, "iscsi.login.csg", l.csg.bits(), ctx);
            check!(row, "iscsi.login.nsg", l.nsg.bits(), ctx);
            check!(row, "iscsi.versionmax", l.version_max, ctx);
            check!(row, "iscsi.versionmin", l.version_min, ctx);
            check!(row, "iscsi.cid", l.cid, ctx);
            check!(row, "iscsi.tsih", l.tsih, ctx);
            check!(row, "iscsi.cmdsn", l.cmd_sn, ctx);
            check!(row, "iscsi.expstatsn", l.exp_stat_sn, ctx);
            check_isid(row, &l.isid, ctx);
            check_keys(row, pdu, ctx);
        }
        Bhs::LoginResponse(l) => {
            check!(row, "iscsi.login.T", l.transit, ctx);
            check!(row, "iscsi.login.C", l.continue_bit, ctx);
            check!(row, "iscsi.login.csg", l.csg.bits(), ctx);
            check!(row, "iscsi.login.nsg", l.nsg.bits(), ctx);
            check!(row, "iscsi.versionmax", l.version_max, ctx);
            check!(row, "iscsi.versionactive", l.version_active, ctx);
            check!(row, "iscsi.tsih", l.tsih, ctx);
            check!(row, "iscsi.statsn", l.stat_sn, ctx);
            check!(row, "iscsi.expcmdsn", l.exp_cmd_sn, ctx);
            check!(row, "iscsi.maxcmdsn", l.max_cmd_sn, ctx);
            let status = (u16::from(l.status.class) << 8) | u16::from(l.status.detail);
            check!(row, "iscsi.login.status", status, ctx);
            check_isid(row, &l.isid, ctx);
            check_keys(row, pdu, ctx);
        }
        Bhs::TextRequest(t) => {
            check!(row, "iscsi.text.F", t.final_bit, ctx);
            check!(row, "iscsi.text.C", t.continue_bit, ctx);
            check!(row, "iscsi.targettransfertag", t.ttt, ctx);
            check!(row, "iscsi.cmdsn", t.cmd_sn, ctx);
            check_keys(row, pdu, ctx);
        }
        Bhs::TextResponse(t) => {
            check!(row, "iscsi.text.F", t.final_bit, ctx);
            check!(row, "iscsi.text.C", t.continue_bit, ctx);
            check!(row, "iscsi.targettransfertag", t.ttt, ctx);
            check!(row, "iscsi.statsn", t.stat_sn, ctx);
            check_keys(row, pdu, ctx);
        }
        Bhs::NopOut(n) => {
            check!(row, "iscsi.I", n.immediate, ctx);
            check!(row, "iscsi.targettransfertag", n.ttt, ctx);
            check!(row, "iscsi.cmdsn", n.cmd_sn, ctx);
            check!(row, "iscsi.expstatsn", n.exp_stat_sn, ctx);
        }
        Bhs::NopIn(n) => {
            check!(row, "iscsi.targettransfertag", n.ttt, ctx);
            check!(row, "iscsi.statsn", n.stat_sn, ctx);
            check!(row, "iscsi.expcmdsn", n.exp_cmd_sn, ctx);
            check!(row, "iscsi.maxcmdsn", n.max_cmd_sn, ctx);
        }
        Bhs::TaskMgmtRequest(t) => {
            check!(row, "iscsi.taskmanfun.function", t.function.to_u8(), ctx);
            check!(
                row,
                "iscsi.taskmanfun.referencedtasktag",
                t.referenced_task_tag,
                ctx
            );
            check!(row, "iscsi.refcmdsn", t.ref_cmd_sn, ctx);
            check!(row, "iscsi.cmdsn", t.cmd_sn, ctx);
        }
        Bhs::TaskMgmtResponse(t) => {
            check!(row, "iscsi.taskmanfun.response", t.response.to_u8(), ctx);
            check!(row, "iscsi.statsn", t.stat_sn, ctx);
        }
        Bhs::LogoutRequest(l) => {
            check!(row, "iscsi.logout.reason", l.reason.to_u8(), ctx);
            check!(row, "iscsi.cid", l.cid, ctx);
            check!(row, "iscsi.cmdsn", l.cmd_sn, ctx);
        }
        Bhs::LogoutResponse(l) => {
            check!(row, "iscsi.logout.response", l.response.to_u8(), ctx);
            check!(row, "iscsi.time2wait", l.time2wait, ctx);
            check!(row, "iscsi.time2retain", l.time2retain, ctx);
            check!(row, "iscsi.statsn", l.stat_sn, ctx);
        }
        other => panic!("{ctx}: no comparison written for {:?}", other.opcode()),
    }
}

fn check_isid(row: &Row, isid: &[u8; 6], ctx: &str) {
    if let Some(v) = row.get("iscsi.isid") {
        let ours: Vec<String> = isid.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(v, &ours.join(":"), "{ctx}: ISID");
    }
}

fn check_keys(row: &Row, pdu: &Pdu, ctx: &str) {
    if let Some(v) = row.get("iscsi.keyvalue") {
        let ours: Vec<String> = parse_text(&pdu.data)
            .unwrap()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(v, &ours.join("|"), "{ctx}: key=value text");
    }
}

#[test]
fn tgtd_libiscsi_captures_decode_field_by_field() {
    let mut sessions = 0;
    let mut pdus = 0;
    let mut opcodes: HashMap<Opcode, usize> = HashMap::new();
    let mut digested = 0;
    let mut entries: Vec<_> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for tsv in entries
        .iter()
        .filter(|p| p.to_string_lossy().ends_with(".tshark.tsv"))
    {
        let stem = tsv
            .to_string_lossy()
            .trim_end_matches(".tshark.tsv")
            .to_string();
        let rows = read_tsv(tsv);
        let negotiated = negotiated_digests(&std::fs::read(format!("{stem}.t2i.bin")).unwrap());
        for dir in ["i2t", "t2i"] {
            let bytes = std::fs::read(format!("{stem}.{dir}.bin")).unwrap();
            let decoded = decode_stream(&bytes, negotiated);
            let expected: Vec<&Row> = rows.iter().filter(|r| r["dir"] == dir).collect();
            assert_eq!(decoded.len(), expected.len(), "{stem}.{dir}: PDU count");
            for (i, ((offset, len, pdu, digests), row)) in decoded.iter().zip(&expected).enumerate()
            {
                let ctx = format!(
                    "{}.{dir} PDU {i} ({:?})",
                    Path::new(&stem).file_name().unwrap().to_string_lossy(),
                    pdu.bhs.opcode()
                );
                assert_eq!(num(&row["pdu_index"]) as usize, i, "{ctx}");
                assert_eq!(
                    (num(&row["offset"]) as usize, num(&row["length"]) as usize),
                    (*offset, *len),
                    "{ctx}: byte range"
                );
                compare(row, pdu, &ctx);
                if digests.header {
                    digested += 1;
                    let ours = blockwire_pdu::digest::crc32c_digest(&bytes[*offset..*offset + 48]);
                    // tshark prints the digest as the big-endian reading of the 4 bytes.
                    check!(row, "iscsi.headerdigest32", ours.swap_bytes(), &ctx);
                }
                // Canonical encoding: the same bytes come back.
                assert_eq!(
                    pdu.encode(*digests),
                    &bytes[*offset..*offset + *len],
                    "{ctx}: re-encoding differs"
                );
                *opcodes.entry(pdu.bhs.opcode()).or_default() += 1;
                pdus += 1;
            }
        }
        sessions += 1;
    }
    assert!(sessions >= 16, "fixtures missing: {sessions} sessions");
    assert!(digested > 0, "no header-digest session decoded");
    // The captures cover the PDUs of a real session in both directions.
    for op in [
        Opcode::LoginRequest,
        Opcode::LoginResponse,
        Opcode::TextRequest,
        Opcode::TextResponse,
        Opcode::ScsiCommand,
        Opcode::ScsiResponse,
        Opcode::DataOut,
        Opcode::DataIn,
        Opcode::R2t,
        Opcode::NopOut,
        Opcode::NopIn,
        Opcode::TaskMgmtRequest,
        Opcode::TaskMgmtResponse,
        Opcode::LogoutRequest,
        Opcode::LogoutResponse,
    ] {
        assert!(opcodes.contains_key(&op), "no {op:?} in the captures");
    }
    let compared = COMPARED.load(std::sync::atomic::Ordering::Relaxed);
    // A misspelt field name would silently compare nothing: insist on many.
    assert!(
        compared > 8 * pdus,
        "only {compared} fields compared for {pdus} PDUs"
    );
    println!("{sessions} sessions, {pdus} PDUs, {compared} fields equal to tshark's, {digested} with header digests: {opcodes:?}");
}
